"""Exact top-k inner-product search over L2-normalised embeddings.

The papers search the whole corpus exactly (a flat inner-product index or a
full matrix product).  :func:`exact_topk` does the same with chunked matrix
products (memory ~ ``query_chunk x doc_chunk`` floats) and a running top-k
merge; :func:`faiss_topk` uses ``faiss.IndexFlatIP`` (also exact) when the
optional ``faiss`` package is installed.  Ties are broken by the lower document
index, so results are deterministic.
"""

from __future__ import annotations

import numpy as np

from posfair.encoding import l2_normalize

__all__ = ["exact_topk", "faiss_topk", "search"]


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array; got shape {x.shape}")
    return l2_normalize(x)


def _sorted_topk(scores: np.ndarray, idx: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    # order by score descending, then by document index ascending (lexsort: last key is primary)
    order = np.lexsort((idx, -scores), axis=1)[:, :k]
    return np.take_along_axis(idx, order, 1), np.take_along_axis(scores, order, 1)


def exact_topk(
    queries: np.ndarray, docs: np.ndarray, k: int = 100, query_chunk: int = 1024, doc_chunk: int = 50_000
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` documents per query by inner product of L2-normalised vectors.

    Returns ``(indices, scores)`` of shape ``(n_queries, min(k, n_docs))``, best first.
    """
    q = _unit_rows(queries)
    d = _unit_rows(docs)
    if q.shape[1] != d.shape[1]:
        raise ValueError(f"query dimension {q.shape[1]} != document dimension {d.shape[1]}")
    if len(d) == 0:
        raise ValueError("cannot search an empty corpus")
    k = min(k, len(d))
    out_i = np.empty((len(q), k), dtype=np.int64)
    out_s = np.empty((len(q), k), dtype=np.float32)
    for qs in range(0, len(q), query_chunk):
        qb = q[qs : qs + query_chunk]
        best_i = np.empty((len(qb), 0), dtype=np.int64)
        best_s = np.empty((len(qb), 0), dtype=np.float32)
        for ds in range(0, len(d), doc_chunk):
            s = qb @ d[ds : ds + doc_chunk].T
            kk = min(k, s.shape[1])
            part = np.argpartition(-s, kk - 1, axis=1)[:, :kk] if kk < s.shape[1] else np.tile(np.arange(s.shape[1]), (len(qb), 1))
            cand_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], axis=1)
            cand_i = np.concatenate([best_i, part + ds], axis=1)
            best_i, best_s = _sorted_topk(cand_s, cand_i, k)
        out_i[qs : qs + len(qb)] = best_i
        out_s[qs : qs + len(qb)] = best_s
    return out_i, out_s


def faiss_topk(queries: np.ndarray, docs: np.ndarray, k: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """The same search through ``faiss.IndexFlatIP`` (exact); needs ``pip install faiss-cpu``."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError("faiss is not installed: `pip install faiss-cpu` (or use the default exact search)") from e
    q = _unit_rows(queries)
    d = _unit_rows(docs)
    index = faiss.IndexFlatIP(d.shape[1])
    index.add(d)
    scores, idx = index.search(q, min(k, len(d)))
    return idx.astype(np.int64), scores


def search(queries: np.ndarray, docs: np.ndarray, k: int = 100, use_faiss: bool = False) -> tuple[np.ndarray, np.ndarray]:
    return faiss_topk(queries, docs, k) if use_faiss else exact_topk(queries, docs, k)
