"""Exact top-k inner-product search over L2-normalised embeddings.

The papers search the whole corpus exactly (a flat inner-product index or a
full matrix product).  :func:`exact_topk` does the same with chunked matrix
products and a running top-k merge: documents are normalised chunk by chunk, so
memory is ~ ``query_chunk x doc_chunk`` scores plus one normalised chunk, whatever
the corpus size (``docs`` may be a memory-mapped array).  :func:`faiss_topk` uses
``faiss.IndexFlatIP`` (also exact) when the optional ``faiss`` package is
installed; it holds a normalised copy of the whole corpus in RAM.  Ties are broken
by the lower document index, so results are deterministic.

:func:`stored_topk` searches the vectors of a store namespace
(:class:`posfair.store.Namespace`) without loading them: by default it streams the
memory-mapped shards through the same chunked search (bounded memory at any size).
With ``use_faiss=True`` it builds a FAISS flat index when the corpus takes at most
``faiss_max_bytes`` (default 1 GiB, e.g. 700,000 x 384 float32; it needs about twice
that in RAM: the vectors and their normalised copy) and streams above that (with a
warning), so memory never grows with the corpus beyond that bound.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator

import numpy as np

from posfair.encoding import l2_normalize
from posfair.runtime.stacklevel import user_stacklevel

__all__ = ["exact_topk", "faiss_topk", "search", "streaming_topk", "stored_topk", "FAISS_MAX_BYTES"]

FAISS_MAX_BYTES = 1 << 30


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
    if getattr(docs, "ndim", 2) != 2:
        raise ValueError(f"embeddings must be a 2-D array; got shape {np.shape(docs)}")
    return streaming_topk(queries, [docs], k, query_chunk, doc_chunk)


def _batches(chunks: Iterable[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    """Consecutive rows of ``chunks`` regrouped into arrays of ``rows`` (small chunks such as
    shards of 1,024 rows are copied together into one buffer; the last batch may be shorter)."""
    pending: list[np.ndarray] = []
    have = 0
    for chunk in chunks:
        chunk = np.asarray(chunk)  # no copy for arrays (memory-mapped ones included)
        start = 0
        while start < len(chunk):
            take = chunk[start : start + rows - have]
            pending.append(take)
            have += len(take)
            start += len(take)
            if have == rows:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def streaming_topk(
    queries: np.ndarray,
    chunks: Iterable[np.ndarray],
    k: int = 100,
    query_chunk: int = 1024,
    doc_chunk: int = 32_768,
    exclude: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`exact_topk` over documents given as consecutive chunks (e.g. a store's shards); document
    indices count rows across the chunks.  Chunks are regrouped into blocks of ``doc_chunk`` rows, so
    memory is ~ ``doc_chunk x dim`` floats (one block, normalised in place) plus
    ``query_chunk x doc_chunk`` scores, whatever the number of documents.  ``exclude``: sorted row
    indices that are never returned (e.g. a store's second copies of a key)."""
    exclude = np.zeros(0, dtype=np.int64) if exclude is None else np.asarray(exclude, dtype=np.int64)
    q = _unit_rows(queries)
    best_i = np.empty((len(q), 0), dtype=np.int64)
    best_s = np.empty((len(q), 0), dtype=np.float32)
    offset = 0
    for block in _batches(chunks, doc_chunk):
        if block.ndim != 2:
            raise ValueError(f"embeddings must be a 2-D array; got shape {block.shape}")
        # normalised in place in a block of our own (a copy when it views the caller's or a file's memory)
        db = (
            block
            if block.flags.owndata and block.flags.writeable and block.dtype == np.float32
            else np.array(block, np.float32)
        )
        norms = np.sqrt(np.einsum("ij,ij->i", db, db, dtype=np.float32))[:, None]  # no x*x temporary
        np.divide(db, np.maximum(norms, 1e-12), out=db)
        if db.shape[1] != q.shape[1]:
            raise ValueError(f"query dimension {q.shape[1]} != document dimension {db.shape[1]}")
        lo, hi = np.searchsorted(exclude, [offset, offset + len(db)])
        skip = exclude[lo:hi] - offset
        for qs in range(0, len(q), query_chunk):
            s = q[qs : qs + query_chunk] @ db.T
            if len(skip):
                s[:, skip] = -np.inf
            kk = min(k, s.shape[1])
            part = (
                np.argpartition(-s, kk - 1, axis=1)[:, :kk]
                if kk < s.shape[1]
                else np.tile(np.arange(s.shape[1]), (len(s), 1))
            )
            cand_s = np.concatenate([best_s[qs : qs + query_chunk], np.take_along_axis(s, part, 1)], axis=1)
            cand_i = np.concatenate([best_i[qs : qs + query_chunk], part + offset], axis=1)
            top_i, top_s = _sorted_topk(cand_s, cand_i, k)
            if qs == 0:  # the candidate width grows until it reaches k
                new_i = np.empty((len(q), top_i.shape[1]), dtype=np.int64)
                new_s = np.empty((len(q), top_i.shape[1]), dtype=np.float32)
            new_i[qs : qs + len(s)], new_s[qs : qs + len(s)] = top_i, top_s
        best_i, best_s = new_i, new_s
        offset += len(db)
        del block, db, s, part, cand_s, cand_i  # freed before the next block is gathered
    if offset == 0:
        raise ValueError("cannot search an empty corpus")
    if len(exclude):  # fewer than k documents left: excluded rows may fill the tail
        valid = np.isfinite(best_s)
        if not valid.all():
            width = int(valid.sum(1).min())
            best_i, best_s = best_i[:, :width], best_s[:, :width]
    return best_i, best_s


def stored_topk(
    queries: np.ndarray, namespace, k: int = 100, use_faiss: bool = False, faiss_max_bytes: int = FAISS_MAX_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` stored keys per query of a store namespace: ``(keys, scores)``, keys an object array.

    Streams the memory-mapped shards (bounded memory); ``use_faiss`` builds a FAISS flat
    index instead when the corpus takes at most ``faiss_max_bytes`` (see the module).  A key
    stored in two shards is searched once (its first copy, the one lookups return).
    """
    rows = namespace.shards.rows
    dim = namespace.dim or 0
    redundant = namespace.shards.redundant_rows()
    if use_faiss and rows * dim * 4 <= faiss_max_bytes:
        docs = np.concatenate(list(namespace.chunks())) if rows else np.zeros((0, dim), np.float32)
        if len(redundant):
            kept = np.delete(np.arange(rows), redundant)
            idx, scores = faiss_topk(queries, docs[kept], k)
            idx = kept[idx]
        else:
            idx, scores = faiss_topk(queries, docs, k)
    else:
        if use_faiss:
            warnings.warn(
                f"{rows} x {dim} vectors take more than faiss_max_bytes={faiss_max_bytes}: streaming exact search instead of FAISS",
                stacklevel=user_stacklevel(),
            )
        idx, scores = streaming_topk(queries, namespace.chunks(), k, exclude=redundant)
    return namespace.keys_at(idx), scores


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


def search(
    queries: np.ndarray, docs: np.ndarray, k: int = 100, use_faiss: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    return faiss_topk(queries, docs, k) if use_faiss else exact_topk(queries, docs, k)
