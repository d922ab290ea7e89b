"""A refused corpus says what a corpus is: its fields, one topic per id, languages; every field's nulls at once; a
.txt names the commands that read plain texts (issue 40 item 9)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from posfair.corpus import load_corpus
from posfair.corpus.aligned import CorpusError


def test_every_fields_nulls_are_named_at_once():
    df = pd.DataFrame({"id": ["t1", None, "t3"], "lang": ["en", "en", None], "text": ["a", "b", "c"]})
    with pytest.raises(CorpusError, match=r"null value in required field 'id' at row \[1\].*; 'lang' at row \[2\]"):
        load_corpus(df)


def test_a_missing_field_and_a_txt_file_say_what_a_corpus_record_is(tmp_path):
    with pytest.raises(CorpusError, match=r"missing required field\(s\) 'lang'.*records sharing an id are the same"):
        load_corpus(pd.DataFrame({"id": ["t1"], "text": ["a"]}))
    txt = tmp_path / "texts.txt"
    txt.write_text("one text\n")
    with pytest.raises(CorpusError, match=r"posfair encode / posfair embed.*'id' \(the topic"):
        load_corpus(txt)


def test_a_corpus_file_that_is_not_utf8_is_named_by_its_line_and_byte_as_every_input_file(tmp_path):
    """Issue 57 item 4.1: a .jsonl corpus in Latin-1 ended as 'unexpected UnicodeDecodeError'; it is refused as
    posfair encode refuses a text file that is not UTF-8 (one rule, posfair.files.reading.read_utf8), by the
    corpus reader and by the reader of texts to embed (a posfair corpus, or a plain .jsonl field)."""
    from posfair.corpus.texts import read_corpus_texts

    rows = ['{"id": "t1", "lang": "en", "text": "coffee"}', '{"id": "t1", "lang": "fr", "text": "caf\xe9"}']
    path = tmp_path / "latin1.jsonl"
    path.write_bytes("\n".join(rows).encode("latin-1") + b"\n")
    column = rows[1].index("\xe9") + 1
    said = f"{path}: line 2 is not UTF-8 text (invalid continuation byte at byte {column} of the line)"
    for read in (load_corpus, read_corpus_texts, lambda p: read_corpus_texts(p, text_field="lang")):
        with pytest.raises(CorpusError if read is load_corpus else ValueError) as refused:
            read(path)
        assert str(refused.value) == said


def test_a_byte_order_mark_and_a_line_separator_inside_a_text_are_read_as_text(tmp_path):
    """Read as every input file: a UTF-8 byte-order mark is not part of the first record (it was a JSON error), and
    lines end at \\n only (a U+2028 inside a text cut the record in two)."""
    records = [{"id": "t1", "lang": "en", "text": "one\u2028line"}, {"id": "t1", "lang": "de", "text": "eine"}]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode())
    df = load_corpus(path)
    assert df["text"].tolist() == ["one\u2028line", "eine"]
