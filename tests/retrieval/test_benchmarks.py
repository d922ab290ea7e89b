import random
import warnings

import numpy as np
import pandas as pd
import pytest

from posfair.retrieval.benchmarks import (
    build_from_corpus,
    load_benchmark,
    load_fineweb_posq,
    load_posir,
    load_squad_posq,
)


def _squad_rows(split, n, offset=0):
    rows = []
    for i in range(n):
        ctx = f"Context {(i + offset) % 4} " + "x" * 600
        start = [0, 100, 250, 520][(i + offset) % 4]
        rows.append(
            {
                "id": f"{split}{i}",
                "title": "T",
                "context": ctx,
                "question": f"question {i + offset}?",
                "answers": {"text": ["x"], "answer_start": [start, 7]},
            }
        )
    rows.append(
        {
            "id": f"{split}-unans",
            "title": "T",
            "context": f"Unanswerable context of {split}",
            "question": "nothing?",
            "answers": {"text": [], "answer_start": []},
        }
    )
    return rows


def test_squad_posq_saved_dataset_layout(tmp_path):
    import datasets

    train = _squad_rows("train", 8)
    train.append({**train[0], "id": "dup", "context": "Context replaced " + "y" * 50})  # same question text again
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(train),
            "validation": datasets.Dataset.from_list(_squad_rows("validation", 3, 8)),
        }
    )
    dd.save_to_disk(tmp_path / "squad")
    b = load_squad_posq(str(tmp_path / "squad"))
    contexts = sorted({r["context"] for r in train} | {r["context"] for r in _squad_rows("validation", 3, 8)})
    assert b.corpus_texts == contexts  # every context incl. unanswerable, deduplicated, sorted
    assert len(b.query_ids) == 8 + 1 + 3  # answerable only
    # a repeated question text points to the context of its last occurrence (reference behaviour)
    replaced = b.corpus_ids[contexts.index("Context replaced " + "y" * 50)]
    assert b.qrels["train0"] == {replaced: 1} and b.qrels["dup"] == {replaced: 1}
    # groups use answers.answer_start[0]; 100 is in both 0+ and 100+ (inclusive bounds)
    i100 = b.query_ids.index("train1")
    assert b.groups["0+"][i100] and b.groups["100+"][i100]
    assert b.groups["500+"][b.query_ids.index("train3")]
    # same data from a parquet file per split in a directory (hub file layout)
    (tmp_path / "pq").mkdir()
    pd.DataFrame(train).to_parquet(tmp_path / "pq" / "train-00000-of-00001.parquet")
    pd.DataFrame(_squad_rows("validation", 3, 8)).to_parquet(tmp_path / "pq" / "validation-00000-of-00001.parquet")
    b2 = load_benchmark(str(tmp_path / "pq"))
    assert b2.corpus_texts == b.corpus_texts and b2.query_texts == b.query_texts


def test_squad_tiny_sampling_reproduces_reference():
    rows = _squad_rows("train", 30)
    b = load_squad_posq(rows, sample=10)
    ref = [[r["question"], r["answers"]["answer_start"][0]] for r in rows if r["answers"]["answer_start"]]
    random.seed(42)
    random.shuffle(ref)
    assert b.query_texts == [q for q, _ in ref[:10]]
    assert len(b.corpus_texts) == 5


def test_fineweb_posq_jsonl_layout(tmp_path):
    rows = [
        {"question": "q1", "content": "doc A", "span_class": ["beginning"]},
        {"question": "q2", "content": "doc B", "span_class": ["middle", "end"]},
        {"question": None, "content": "doc C", "span_class": []},
        {"question": "q3", "content": "doc A", "span_class": ["end"]},
    ]
    path = tmp_path / "fineweb.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    b = load_benchmark(str(path))
    assert b.name == "fineweb-posq" and b.corpus_texts == ["doc A", "doc B", "doc C"]
    assert b.query_texts == ["q1", "q2", "q3"]
    assert b.groups["end"].tolist() == [False, True, True] and b.groups["middle"].tolist() == [False, True, False]
    assert b.qrels["2"] == {"0": 1}


def _write_posir(root, lang, domain, n_docs=4, corpus_only=False):
    d = root / lang / domain
    (d / "qrels").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {"_id": [f"c{i}" for i in range(n_docs)], "text": [f"{lang} {domain} doc {i}" for i in range(n_docs)]}
    ).to_parquet(d / "corpus.parquet")
    if corpus_only:
        return
    pd.DataFrame(
        {
            "_id": [f"q{i}" for i in range(n_docs)],
            "text": [f"{lang} query {i}" for i in range(n_docs)],
            "pos_char_span": [[0, 10], [40, 60], [90, 100], [0, 0]],
            "pos_char_length": [100, 100, 100, 0],
            "pos_token_length": [100, 600, 2000, 0],
        }
    ).to_parquet(d / "queries.parquet")
    pd.DataFrame(
        {
            "query-id": [f"q{i}" for i in range(n_docs)] + ["ghost"],
            "corpus-id": [f"c{i}" for i in range(n_docs)] + ["c0"],
            "score": [1] * (n_docs + 1),
        }
    ).to_parquet(d / "qrels" / "test.parquet")


def test_posir_layout_mono_and_cross(tmp_path):
    for lang in ("eng-Latn", "deu-Latn"):
        for dom in ("law", "medicine"):
            _write_posir(tmp_path, lang, dom)
    (tmp_path / "deu-Latn" / "empty").mkdir()
    with pytest.warns(UserWarning, match="skipped domain"):
        b = load_posir(tmp_path, lang="de", corpus_lang="en")
    assert b.name == "posir[deu-Latn->eng-Latn]"
    assert len(b.query_ids) == 8 and b.corpus_texts[0] == "eng-Latn law doc 0"  # English corpus
    assert b.query_texts[0] == "deu-Latn query 0"
    assert b.length_bucket[:4] == ["Q1", "Q2", "Q4", None]
    assert b.relpos[:3] == pytest.approx([0.05, 0.5, 0.95]) and np.isnan(b.relpos[3])
    assert [len(qi) for _, qi, _ in b.domain_slices()] == [4, 4]  # search is per domain
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mono = load_benchmark(str(tmp_path), lang="eng-Latn", domains=["law"])
    assert mono.name == "posir[eng-Latn]" and len(mono.corpus_ids) == 4


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("no-such-benchmark")
    with pytest.raises(ValueError, match="missing field"):
        load_squad_posq([{"question": "q", "context": "c"}])
    with pytest.raises(ValueError, match="no rows"):
        load_fineweb_posq([])
    with pytest.raises(ValueError, match="no row has a question"):
        load_fineweb_posq([{"question": "", "content": "c", "span_class": []}])
    d = tmp_path / "eng-Latn" / "x"
    (d / "qrels").mkdir(parents=True)
    pd.DataFrame({"_id": ["q"], "text": ["t"]}).to_parquet(d / "queries.parquet")
    pd.DataFrame({"_id": ["c"], "text": ["t"]}).to_parquet(d / "corpus.parquet")
    pd.DataFrame({"query-id": ["q"], "corpus-id": ["c"], "score": [1]}).to_parquet(d / "qrels" / "test.parquet")
    with pytest.raises(ValueError, match="missing column"):
        load_posir(tmp_path)
    with pytest.raises(ValueError, match="no language directory"):
        load_posir(tmp_path, lang="fra-Latn")


def test_build_from_corpus_layout(tmp_path, corpus_df):
    out = build_from_corpus(corpus_df, tmp_path / "b", langs=["en", "de"], k=3, seed=7, max_doc_tokens=None)
    q = pd.read_parquet(out / "eng-Latn" / "all" / "queries.parquet")
    c = pd.read_parquet(out / "eng-Latn" / "all" / "corpus.parquet")
    r = pd.read_parquet(out / "eng-Latn" / "all" / "qrels" / "test.parquet")
    assert sorted(q["segment_id"]) == sorted(corpus_df["id"].unique())  # every segment exactly once
    assert len(c) == 4 and set(q["segment_position"]) == {1, 2, 3}
    docs = dict(zip(c["_id"], c["text"], strict=True))
    en = corpus_df[corpus_df.lang == "en"].set_index("id")
    for _, row in q.iterrows():
        did = r.loc[r["query-id"] == row["_id"], "corpus-id"].item()
        s, e = row["pos_char_span"]
        assert docs[did][s:e] == en.at[row["segment_id"], "text"]  # span = the segment, title removed
        assert row["text"] == en.at[row["segment_id"], "title"]
        assert row["pos_char_length"] == len(docs[did])
    # one join rule with the audit: the segments in position order, separated by one space
    for did, rows in q.groupby(r.set_index("query-id").loc[q["_id"], "corpus-id"].to_numpy()):
        texts = [en.at[sid, "text"] for sid in rows.sort_values("segment_position")["segment_id"]]
        assert docs[did] == " ".join(texts)
    q_de = pd.read_parquet(out / "deu-Latn" / "all" / "queries.parquet")
    r_de = pd.read_parquet(out / "deu-Latn" / "all" / "qrels" / "test.parquet")
    assert (
        r_de.merge(q_de, left_on="query-id", right_on="_id")[["segment_id", "corpus-id"]]
        .sort_values("segment_id")
        .values.tolist()
        == r.merge(q, left_on="query-id", right_on="_id")[["segment_id", "corpus-id"]]
        .sort_values("segment_id")
        .values.tolist()
    )
    again = build_from_corpus(corpus_df, tmp_path / "b2", langs=["en", "de"], k=3, seed=7, max_doc_tokens=None)
    assert pd.read_parquet(again / "eng-Latn" / "all" / "corpus.parquet").equals(c)
    b = load_posir(out, lang="de", corpus_lang="en")
    assert list(b.groups) == ["seg 1", "seg 2", "seg 3"] and b.groups["seg 1"].sum() == 4


def test_build_token_budget(tmp_path, corpus_df):
    corpus_df.loc[corpus_df["id"] == "faq/apt", "n_tokens_minilm"] = 400
    out = build_from_corpus(corpus_df, tmp_path / "b", langs=["en"], k=2, max_doc_tokens=200)
    q = pd.read_parquet(out / "eng-Latn" / "all" / "queries.parquet")
    assert "faq/apt" not in set(q["segment_id"]) and len(q) == 11
    assert (q["pos_token_length"] <= 200).all()
    with pytest.raises(ValueError, match="no usable rows"):
        build_from_corpus(corpus_df, tmp_path / "c", langs=["fr"])
