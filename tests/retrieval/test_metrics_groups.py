import math

import numpy as np
import pandas as pd
import pytest

from posfair.retrieval.groups import (
    fineweb_group_masks,
    posir_length_bucket,
    posir_relative_position,
    relpos_bin,
    squad_group_masks,
)
from posfair.retrieval.metrics import group_scores, harmonic_mean, ndcg_at_k, posir_bucket_scores, psi, recall_at_k
from posfair.retrieval.search import exact_topk


def test_ndcg_hand_computed():
    ranked = np.array([[3, 1, 2], [1, 0, 2], [0, 2, 3]])
    got = ndcg_at_k(ranked, [[1], [1], [1]], k=10)
    # positive at rank 2 -> 1/log2(3); at rank 1 -> 1; absent -> 0
    assert got == pytest.approx([1 / math.log2(3), 1.0, 0.0])
    # two positives at ranks 2 and 3: DCG = 1/log2(3) + 1/log2(4); IDCG = 1 + 1/log2(3)
    got = ndcg_at_k(np.array([[0, 5, 1, 7]]), [[1, 5]], k=10)
    assert got[0] == pytest.approx((1 / math.log2(3) + 0.5) / (1 + 1 / math.log2(3)))
    # rank 11 is outside the cut-off
    assert ndcg_at_k(np.arange(20)[None, :], [[10]], k=10)[0] == 0.0
    assert ndcg_at_k(np.arange(20)[None, :], [[9]], k=10)[0] == pytest.approx(1 / math.log2(11))


def test_recall_hand_computed():
    assert recall_at_k(np.array([[0, 5, 1, 7]]), [[1, 5, 9]], k=3)[0] == pytest.approx(2 / 3)


def test_ndcg_matches_ir_measures_and_sklearn():
    import ir_measures
    from ir_measures import nDCG
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(0)
    n_q, n_d = 40, 60
    scores = rng.normal(size=(n_q, n_d))
    ranked = np.argsort(-scores, axis=1)
    relevant = [rng.choice(n_d, size=rng.integers(1, 4), replace=False) for _ in range(n_q)]
    ours = ndcg_at_k(ranked, relevant, k=10)
    qrels = [ir_measures.Qrel(f"q{i}", f"d{j}", 1) for i, rel in enumerate(relevant) for j in rel]
    run = [ir_measures.ScoredDoc(f"q{i}", f"d{j}", float(scores[i, j])) for i in range(n_q) for j in range(n_d)]
    ref = {m.query_id: m.value for m in ir_measures.iter_calc([nDCG @ 10], qrels, run)}
    assert ours == pytest.approx([ref[f"q{i}"] for i in range(n_q)], abs=1e-9)
    # single positive: the PosQ reference computes sklearn's ndcg_score on the top-100 list
    single = [r[:1] for r in relevant]
    ours1 = ndcg_at_k(ranked, single, k=10)
    top_scores = np.take_along_axis(scores, ranked, 1)
    y_true = ranked == np.array([r[0] for r in single])[:, None]
    for i in range(n_q):
        assert ours1[i] == pytest.approx(ndcg_score(y_true[i : i + 1], top_scores[i : i + 1], k=10))


def test_harm_psi_and_empty_groups():
    per_q = np.array([1.0, 0.5, 0.0, 1.0])
    masks = {"a": np.array([1, 1, 0, 0], bool), "b": np.array([0, 0, 1, 1], bool), "c": np.zeros(4, bool)}
    g = group_scores(per_q, masks)
    assert g["a"] == 0.75 and g["b"] == 0.5 and math.isnan(g["c"])
    assert harmonic_mean(g) == pytest.approx(2 / (1 / 0.75 + 1 / 0.5))  # 0.6, empty group skipped
    assert psi(g) == pytest.approx(1 - 0.5 / 0.75)
    assert harmonic_mean([0.8, 0.0]) == 0.0
    assert math.isnan(psi([])) and math.isnan(harmonic_mean([float("nan")]))


def test_squad_groups_inclusive_and_half_open():
    starts = [0, 99, 100, 101, 500, 3120, 3121]
    inc = squad_group_masks(starts)
    assert list(inc) == ["0+", "100+", "200+", "300+", "400+", "500+"]
    assert inc["0+"].tolist() == [True, True, True, False, False, False, False]
    assert inc["100+"].tolist() == [False, False, True, True, False, False, False]  # 100 counts twice
    assert inc["400+"][4] and inc["500+"][4] and inc["500+"][5] and not inc["500+"][6]
    half = squad_group_masks(starts, convention="half-open")
    assert half["0+"].tolist() == [True, True, False, False, False, False, False]
    assert sum(m[2] for m in half.values()) == 1
    with pytest.raises(ValueError, match="convention"):
        squad_group_masks(starts, convention="closed")


def test_fineweb_groups_multi_membership():
    g = fineweb_group_masks([["beginning"], ["middle", "end"], ["end"]])
    assert g["begin"].tolist() == [True, False, False] and g["end"].tolist() == [False, True, True]
    with pytest.raises(ValueError, match="unknown span_class"):
        fineweb_group_masks([["start"]])


def test_posir_buckets_bins_relpos():
    assert [posir_length_bucket(x) for x in (0, 1, 512, 513, 1024, 1536, 1537, None)] == [
        None,
        "Q1",
        "Q1",
        "Q2",
        "Q2",
        "Q3",
        "Q4",
        None,
    ]
    assert posir_relative_position([10, 30], 100) == pytest.approx(0.2)
    assert posir_relative_position([90, 130], 100) == 1.0  # midpoint capped at the length
    assert math.isnan(posir_relative_position([0, 10], 0))
    rng = np.random.default_rng(1)
    r = np.concatenate([rng.random(500), np.linspace(0, 1, 21), [0.0, 1.0]])
    ref = pd.cut(r, np.linspace(0, 1, 21), include_lowest=True, labels=False)
    assert relpos_bin(r).tolist() == ref.tolist()
    assert relpos_bin([float("nan")]).tolist() == [-1]


def test_posir_bucket_psi_hand_computed():
    per_q = np.array([1.0, 0.5, 0.2, 0.9, 0.3])
    buckets = ["Q1", "Q1", "Q1", "Q2", None]
    bins = np.array([0, 0, 19, 5, 3])
    out = posir_bucket_scores(per_q, buckets, bins)
    assert set(out) == {"Q1", "Q2"}
    assert out["Q1"]["bins"] == {0: 0.75, 19: 0.2}
    assert out["Q1"]["psi"] == pytest.approx(1 - 0.2 / 0.75)
    assert out["Q1"]["ndcg@10"] == pytest.approx(1.7 / 3)
    assert out["Q2"]["psi"] == 0.0


def test_exact_topk_matches_bruteforce_with_chunks():
    rng = np.random.default_rng(2)
    q, d = rng.normal(size=(23, 8)), rng.normal(size=(57, 8))
    idx, sc = exact_topk(q, d, k=10, query_chunk=5, doc_chunk=7)
    qn, dn = q / np.linalg.norm(q, axis=1, keepdims=True), d / np.linalg.norm(d, axis=1, keepdims=True)
    full = qn @ dn.T
    assert idx.tolist() == np.argsort(-full, axis=1, kind="stable")[:, :10].tolist()
    assert np.allclose(sc, np.sort(full, axis=1)[:, ::-1][:, :10], atol=1e-6)
    # ties break towards the lower index
    idx2, _ = exact_topk(np.ones((1, 2)), np.ones((5, 2)), k=3, doc_chunk=2)
    assert idx2.tolist() == [[0, 1, 2]]
