"""The numbers of a benchmark folder are checked when read (issue 38, items 6-8) and qrels scores are graded
relevance, as trec_eval / pytrec_eval / ir-measures compute nDCG (item 7)."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
from tests.retrieval.conftest import aligned_corpus
from typer.testing import CliRunner

from posfair.cli import app
from posfair.retrieval.benchmarks import RetrievalBenchmark, build_from_corpus, load_benchmark
from posfair.retrieval.evaluator import score_rankings
from posfair.retrieval.metrics import ndcg_at_k

LANG_DIR = "eng-Latn/all"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A benchmark built offline (12 queries, 4 documents of 3 sections), no model needed."""
    out = tmp_path_factory.mktemp("bench") / "bench"
    build_from_corpus(aligned_corpus(), out, langs=["en"], k=3, max_doc_tokens=None)
    return out


def _variant(built, tmp_path, table: str, edit) -> tuple:
    """A copy of the built benchmark with ``edit(frame)`` applied to its ``queries`` or ``qrels`` table."""
    root = tmp_path / "bench"
    shutil.copytree(built, root)
    path = root / LANG_DIR / ("qrels/test.parquet" if table == "qrels" else "queries.parquet")
    df = pd.read_parquet(path)
    df = edit(df)
    df.to_parquet(path)
    return root, path


@pytest.fixture
def no_model(monkeypatch):
    from posfair.cli import checks

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _set(column, row, value, dtype=None):
    def edit(df):
        if dtype is not None:
            df[column] = df[column].astype(dtype)
        df.loc[row, column] = value
        return df

    return edit


# --- item 6: a qrels score that is not a finite number ------------------------------------------------------


@pytest.mark.parametrize("value,shown", [(float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan")])
def test_non_finite_qrels_score_refused_at_read(built, tmp_path, value, shown):
    root, path = _variant(built, tmp_path, "qrels", _set("score", 2, value, float))
    with pytest.raises(ValueError) as err:
        load_benchmark(str(root))
    assert str(err.value) == f"{path}: row 2: 'score' is {shown}: a qrels score must be a finite number"


def test_non_finite_qrels_score_cli_exit_2_before_the_model(built, tmp_path, no_model):
    root, path = _variant(built, tmp_path, "qrels", _set("score", 5, float("inf"), float))
    r = CliRunner().invoke(app, ["retrieval", "--benchmark", str(root), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == (
        f"error: {path}: row 5: 'score' is inf: a qrels score must be a finite number"
    )


def test_one_pair_with_two_scores_refused(built, tmp_path):
    def repeat(df):
        extra = df.iloc[[3]].assign(score=2)
        return pd.concat([df, extra], ignore_index=True)

    root, path = _variant(built, tmp_path, "qrels", repeat)
    with pytest.raises(ValueError, match=rf"^{path}: rows 3 and 12 give query .* two scores \(1 and 2\)"):
        load_benchmark(str(root))


# --- item 7: graded relevance --------------------------------------------------------------------------------


def _ir_measures_ndcg10(qrels: dict[str, dict[str, int]], ranked: dict[str, list[str]]) -> dict[str, float]:
    """nDCG@10 per query by ir-measures (pytrec_eval, i.e. trec_eval), the run's scores decreasing with rank."""
    import ir_measures
    from ir_measures import Qrel, ScoredDoc, nDCG

    q = [Qrel(qid, did, int(s)) for qid, judged in qrels.items() for did, s in judged.items()]
    run = [ScoredDoc(qid, did, float(len(docs) - r)) for qid, docs in ranked.items() for r, did in enumerate(docs)]
    out = {m.query_id: m.value for m in ir_measures.iter_calc([nDCG @ 10], q, run)}
    return {qid: out.get(qid, 0.0) for qid in qrels}


def test_graded_ndcg_equals_ir_measures():
    """Random graded, fractional and negative scores; nDCG@10 per query against ir-measures.  pytrec_eval takes
    integer relevance only, so ir-measures is given every score times 2 (the scores are multiples of 0.5):
    with linear gains nDCG is unchanged when a query's gains are all scaled by one factor."""
    rng = np.random.default_rng(7)
    n_docs, n_queries, depth = 40, 30, 15
    corpus_ids = [f"d{j}" for j in range(n_docs)]
    qrels: dict[str, dict[str, float]] = {}
    for i in range(n_queries):
        judged = rng.choice(n_docs, size=int(rng.integers(1, 14)), replace=False)
        scores = rng.choice([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0], size=judged.size)
        scores[0] = rng.choice([0.5, 1.0, 2.5])  # every query has a relevant document
        qrels[f"q{i}"] = {corpus_ids[j]: float(s) for j, s in zip(judged, scores, strict=True)}
    b = RetrievalBenchmark(
        name="graded",
        corpus_ids=corpus_ids,
        corpus_texts=[f"text {j}" for j in range(n_docs)],
        query_ids=list(qrels),
        query_texts=[f"query {i}" for i in range(n_queries)],
        qrels=qrels,
    )
    ranked = np.stack([rng.permutation(n_docs)[:depth] for _ in range(n_queries)])
    got = score_rankings(b, ranked)[0]  # the evaluator's own path
    want = _ir_measures_ndcg10(
        {q: {d: int(2 * s) for d, s in judged.items()} for q, judged in qrels.items()},
        {q: [corpus_ids[j] for j in ranked[i]] for i, q in enumerate(qrels)},
    )
    np.testing.assert_allclose(got, [want[q] for q in qrels], rtol=0, atol=1e-12)
    assert len({round(x, 6) for x in got}) > 10  # graded values, not a handful of binary ones
    # relevant = score > 0 (recall, group membership); the gains are the scores
    for i, q in enumerate(qrels):
        positive = {d: s for d, s in qrels[q].items() if s > 0}
        assert [corpus_ids[j] for j in b.relevant[i]] == sorted(positive, key=corpus_ids.index)
        assert b.gains[i].tolist() == [positive[corpus_ids[j]] for j in b.relevant[i]]


def test_binary_qrels_unchanged():
    """With every relevant score 1 the graded nDCG is the binary one."""
    rng = np.random.default_rng(3)
    relevant = [np.sort(rng.choice(30, size=int(rng.integers(1, 5)), replace=False)) for _ in range(20)]
    ranked = np.stack([rng.permutation(30)[:12] for _ in range(20)])
    graded = ndcg_at_k(ranked, relevant, 10, gains=[np.ones(len(r)) for r in relevant])
    np.testing.assert_allclose(graded, ndcg_at_k(ranked, relevant, 10), rtol=0, atol=1e-15)


def test_fractional_score_in_a_benchmark_folder_is_a_gain(built, tmp_path):
    """A second judged document at 0.5 changes nDCG@10 (it was read as 0); a lone 0.5 is a relevant document."""

    def add_half(df):
        first = df.iloc[0]
        other = "d1" if first["corpus-id"] != "d1" else "d2"
        extra = pd.DataFrame([{"query-id": first["query-id"], "corpus-id": other, "score": 0.5}])
        return pd.concat([df.astype({"score": float}), extra], ignore_index=True)

    root, _ = _variant(built, tmp_path, "qrels", add_half)
    b = load_benchmark(str(root))
    qrels = pd.read_parquet(root / LANG_DIR / "qrels/test.parquet")
    qid = f"all/{qrels.loc[0, 'query-id']}"
    i = b.query_ids.index(qid)
    judged = b.qrels[qid]
    assert sorted(judged.values()) == [0.5, 1]
    assert sorted(b.gains[i].tolist()) == [0.5, 1.0]
    # query i ranks the 0.5 document first and its score-1 document second; every other query its own document first
    half, one = (b.corpus_ids.index(d) for d in sorted(judged, key=judged.get))
    ranked = np.array([[int(rel[0])] + [j for j in range(len(b.corpus_ids)) if j != rel[0]] for rel in b.relevant])
    ranked[i] = [half, one] + [j for j in range(len(b.corpus_ids)) if j not in (half, one)]
    ndcg = score_rankings(b, ranked)[0]
    d_half, d_one = 1 / np.log2(2), 1 / np.log2(3)
    assert ndcg[i] == pytest.approx((0.5 * d_half + 1.0 * d_one) / (1.0 * d_half + 0.5 * d_one))
    want = _ir_measures_ndcg10(
        {qid: {d: int(2 * s) for d, s in judged.items()}}, {qid: [b.corpus_ids[j] for j in ranked[i]]}
    )
    assert ndcg[i] == pytest.approx(want[qid], abs=1e-12)

    def lone_half(df):
        df = df.astype({"score": float})
        df.loc[0, "score"] = 0.5
        return df

    root2 = tmp_path / "lone"
    root2.mkdir()
    lone, _ = _variant(built, root2, "qrels", lone_half)
    b2 = load_benchmark(str(lone))
    assert b2.qrels[qid][qrels.loc[0, "corpus-id"]] == 0.5 and b2.gains[b2.query_ids.index(qid)].tolist() == [0.5]


def test_score_zero_or_negative_is_not_relevant():
    with pytest.raises(ValueError, match=r"query 'q' has no relevant document \(score > 0\)"):
        RetrievalBenchmark("b", ["a", "c"], ["x", "y"], ["q"], ["t"], {"q": {"a": 0, "c": -2}})
    with pytest.raises(ValueError, match=r"document 'a': score inf is not a finite number"):
        RetrievalBenchmark("b", ["a"], ["x"], ["q"], ["t"], {"q": {"a": float("inf")}})


def test_mteb_refuses_fractional_scores_by_name():
    pytest.importorskip("mteb")
    from posfair.mteb import tasks
    from posfair.runtime.errors import PosfairInputError

    b = RetrievalBenchmark(
        "frac",
        ["a", "c"],
        ["x", "y"],
        ["q1", "q2"],
        ["t", "u"],
        {"q1": {"a": 1}, "q2": {"c": 0.5}},
        groups={"g": np.array([True, True])},
        meta={"lang": "eng-Latn"},
    )
    with pytest.raises(PosfairInputError, match=r"query 'q2', document 'c' has qrels score 0.5: MTEB .* integer"):
        tasks(b)


# --- item 8: the position columns a built benchmark's groups rely on ---------------------------------------


@pytest.mark.parametrize(
    "column,value,dtype,message",
    [
        ("segment_position", 99, None, "'segment_position' is 99: a segment position must be an integer in 1..3"),
        ("segment_position", -1, None, "'segment_position' is -1: a segment position must be an integer in 1..3"),
        ("segment_position", 1.5, float, "'segment_position' is 1.5: a segment position must be an integer in 1..3"),
        ("segment_position", None, float, "'segment_position' is nan: a segment position must be an integer in 1..3"),
        ("n_segments", 0, None, "'n_segments' is 0: must be a positive integer"),
    ],
)
def test_position_columns_checked_at_read(built, tmp_path, column, value, dtype, message):
    root, path = _variant(built, tmp_path, "queries", _set(column, 4, value, dtype))
    with pytest.raises(ValueError) as err:
        load_benchmark(str(root))
    assert str(err.value).startswith(f"{path}: row 4: {message}")


def test_position_column_of_strings_refused(built, tmp_path):
    root, path = _variant(built, tmp_path, "queries", lambda df: df.astype({"pos_char_length": str}))
    with pytest.raises(ValueError) as err:
        load_benchmark(str(root))
    value = pd.read_parquet(path)["pos_char_length"][0]
    assert str(err.value) == (
        f"{path}: row 0: 'pos_char_length' is a str ({value!r}): must be a number (or null for an undefined position)"
    )


def test_segment_position_beyond_k_without_n_segments(built, tmp_path):
    root, path = _variant(
        built, tmp_path, "queries", lambda df: _set("segment_position", 0, 4)(df.drop(columns="n_segments"))
    )
    with pytest.raises(ValueError, match=r"row 0: 'segment_position' is 4: .* in 1\.\.3 \(k of benchmark\.json\)"):
        load_benchmark(str(root))


def test_segment_position_cli_exit_2_before_the_model(built, tmp_path, no_model):
    root, path = _variant(built, tmp_path, "queries", _set("segment_position", 7, 99))
    r = CliRunner().invoke(app, ["retrieval", "--benchmark", str(root), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: row 7: 'segment_position' is 99: a segment position must be an integer")
