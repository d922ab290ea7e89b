"""A refused corpus says what a corpus is: its fields, one topic per id, languages; every field's nulls at once; a
.txt names the commands that read plain texts (issue 40 item 9)."""

from __future__ import annotations

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
