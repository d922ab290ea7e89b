"""Retrieval metrics of the position-aware benchmarks (plain NumPy).

* nDCG@k with **graded** relevance, as trec_eval / ``pytrec_eval`` (used by PosIR) and
  ir-measures compute it: the gain of a document is its qrels score (a score <= 0 is not
  relevant and gains 0); DCG = sum over ranks r <= k of gain(r) / log2(r + 1);
  IDCG = the same sum over the relevant documents sorted by gain, highest first.
  With binary qrels (every relevant score 1, as in SQuAD-PosQ, FineWeb-PosQ and a
  built benchmark) and one positive this is 1 / log2(rank + 1) when rank <= k, else 0.
  A query without relevant documents scores 0 (as in scikit-learn's ``ndcg_score`` used
  by the PosQ reference code and ``pytrec_eval``).
* recall@k counts relevant documents (score > 0) found, whatever their grade.
* Group score = mean per-query nDCG@10 over the queries of the group; empty
  groups are skipped (NaN) everywhere below.
* Harm = harmonic mean of the group scores (0 if any group scores 0).
* PSI = 1 - min / max of the group scores (NaN if there is no group or max = 0).
* PosIR: per length bucket, mean nDCG@10 per relative-position bin (empty bins
  dropped) and PSI(Q) = 1 - min / max of those bin means; aggregate nDCG@10 =
  mean over all queries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from posfair.retrieval.groups import N_RELPOS_BINS, POSIR_BUCKETS

__all__ = [
    "ndcg_at_k",
    "recall_at_k",
    "group_scores",
    "harmonic_mean",
    "psi",
    "posir_bucket_scores",
]


def _discounts(k: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))


def _hits(ranked: np.ndarray, relevant: Sequence[np.ndarray | Sequence[int]], k: int) -> np.ndarray:
    ranked = np.asarray(ranked)
    if ranked.ndim != 2:
        raise ValueError(f"ranked must be a 2-D array (queries x ranks); got shape {ranked.shape}")
    if len(relevant) != len(ranked):
        raise ValueError(f"{len(ranked)} ranked lists but {len(relevant)} relevance sets")
    top = ranked[:, :k]
    hits = np.zeros(top.shape, dtype=bool)
    for i, rel in enumerate(relevant):
        rel = np.asarray(rel, dtype=top.dtype)
        if rel.size:
            hits[i] = np.isin(top[i], rel)
    return hits


def ndcg_at_k(
    ranked: np.ndarray,
    relevant: Sequence[np.ndarray | Sequence[int]],
    k: int = 10,
    gains: Sequence[np.ndarray | Sequence[float]] | None = None,
) -> np.ndarray:
    """Per-query nDCG@k, graded when ``gains`` are given (binary otherwise).

    Args:
        ranked: (n_queries, depth) document indices, best first (depth may be < k;
            entries < 0 are padding and never relevant).
        relevant: per query, the indices of its relevant documents.
        gains: per query, the gain (qrels score, > 0) of each document of ``relevant``, in
            the same order (:attr:`RetrievalBenchmark.gains`); None = gain 1 for each.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    hits = _hits(ranked, relevant, k)
    disc = _discounts(k)
    if gains is None:
        dcg = (hits * disc[: hits.shape[1]]).sum(axis=1)
        n_rel = np.array([len(np.unique(np.asarray(r))) for r in relevant], dtype=np.int64)
        ideal_cum = np.concatenate([[0.0], np.cumsum(disc)])
        idcg = ideal_cum[np.minimum(n_rel, k)]
    else:
        found = _gains_at(np.asarray(ranked)[:, :k], relevant, gains)
        dcg = (found * disc[: found.shape[1]]).sum(axis=1)
        idcg = np.array(
            [(np.sort(np.asarray(g, dtype=np.float64))[::-1][:k] * disc[: min(len(g), k)]).sum() for g in gains]
        )
    out = np.zeros(len(hits), dtype=np.float64)
    np.divide(dcg, idcg, out=out, where=idcg > 0)
    return out


def _gains_at(top: np.ndarray, relevant: Sequence, gains: Sequence) -> np.ndarray:
    """(n_queries, ranks) the gain of the document at each rank of ``top`` (0 when it is not relevant)."""
    if len(gains) != len(relevant):
        raise ValueError(f"{len(relevant)} relevance sets but {len(gains)} gain lists")
    out = np.zeros(top.shape, dtype=np.float64)
    for i, (rel, g) in enumerate(zip(relevant, gains, strict=True)):
        rel, g = np.asarray(rel, dtype=np.int64), np.asarray(g, dtype=np.float64)
        if rel.shape != g.shape:
            raise ValueError(f"query {i}: {rel.size} relevant documents but {g.size} gains")
        if len(np.unique(rel)) != rel.size:
            raise ValueError(f"query {i}: a relevant document is listed twice (its gain would be ambiguous)")
        if not np.all(np.isfinite(g) & (g > 0)):
            raise ValueError(f"query {i}: gains must be finite and > 0 (a score <= 0 is not relevant)")
        if not rel.size:
            continue
        order = np.argsort(rel)
        rel, g = rel[order], g[order]
        at = np.clip(np.searchsorted(rel, top[i]), 0, rel.size - 1)
        match = rel[at] == top[i]
        out[i, match] = g[at[match]]
    return out


def recall_at_k(ranked: np.ndarray, relevant: Sequence[np.ndarray | Sequence[int]], k: int = 100) -> np.ndarray:
    """Per-query fraction of the relevant documents found in the top k (0 without any)."""
    hits = _hits(ranked, relevant, k).sum(axis=1)
    n_rel = np.array([len(np.unique(np.asarray(r))) for r in relevant], dtype=np.float64)
    out = np.zeros(len(hits), dtype=np.float64)
    np.divide(hits, n_rel, out=out, where=n_rel > 0)
    return out


def group_scores(per_query: np.ndarray, masks: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Mean of ``per_query`` inside each group mask (NaN for an empty group), in mask order."""
    per_query = np.asarray(per_query, dtype=np.float64)
    out = {}
    for group, mask in masks.items():
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != per_query.shape:
            raise ValueError(f"group {group!r}: mask of shape {mask.shape} for {per_query.shape[0]} queries")
        out[group] = float(per_query[mask].mean()) if mask.any() else float("nan")
    return out


def _present(values) -> np.ndarray:
    v = np.asarray(list(values.values()) if isinstance(values, Mapping) else list(values), dtype=np.float64)
    return v[np.isfinite(v)]


def harmonic_mean(values) -> float:
    """Harmonic mean of the non-empty group scores (0 if one of them is 0; NaN if none)."""
    v = _present(values)
    if v.size == 0:
        return float("nan")
    if np.any(v < 0):
        raise ValueError("harmonic mean is defined for non-negative scores only")
    if np.any(v == 0):
        return 0.0
    return float(v.size / np.sum(1.0 / v))


def psi(values) -> float:
    """Position Sensitivity Index 1 - min / max over non-empty groups (NaN if none or max is 0)."""
    v = _present(values)
    if v.size == 0 or v.max() <= 0:
        return float("nan")
    return float(1.0 - v.min() / v.max())


def posir_bucket_scores(
    per_query: np.ndarray, buckets: Sequence[str | None], bins: np.ndarray
) -> dict[str, dict[str, object]]:
    """PosIR per-length-bucket statistics (``buckets``: each query's length bucket, None outside every one).

    Returns ``{bucket: {"n": queries, "ndcg@10": mean, "bins": {bin: mean}, "psi": PSI}}``
    for every bucket with at least one query that has a relative-position bin;
    ``"ndcg@10"`` is over all queries of the bucket.
    """
    per_query = np.asarray(per_query, dtype=np.float64)
    of_query = np.asarray([b if b is not None else "" for b in buckets], dtype=object)
    bins = np.asarray(bins, dtype=np.int64)
    out: dict[str, dict[str, object]] = {}
    for bucket, _, _ in POSIR_BUCKETS:
        in_bucket = of_query == bucket
        if not in_bucket.any():
            continue
        bin_means = {}
        for b in range(N_RELPOS_BINS):
            m = in_bucket & (bins == b)
            if m.any():
                bin_means[b] = float(per_query[m].mean())
        out[bucket] = {
            "n": int(in_bucket.sum()),
            "ndcg@10": float(per_query[in_bucket].mean()),
            "bins": bin_means,
            "psi": psi(bin_means),
        }
    return out
