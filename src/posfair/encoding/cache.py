"""Encoding with the cache: dedupe -> chunk -> cache around the forward passes (:mod:`~posfair.encoding.passes`).

Each distinct text is computed once (:func:`embed_through`), in chunks of ``chunk_size`` written whole and
atomically to the store, so a killed run loses at most one chunk and a resumed run batches exactly as an
uninterrupted one (bit-identical vectors).  :func:`encode_cached` is the pooled vectors of any texts through the
shared embedding namespace; :func:`cached_documents` the document vectors and their contextualised segments.
Embeddings are cached exactly as the model returns them (float32, not normalised); consumers normalise when they
need to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posfair.calibration.choice import MODEL_DEFAULT, CalibrationChoice
from posfair.encoding.passes import encoder, resolved_calibration
from posfair.model import compat, input_reported
from posfair.store import EmbeddingStore, Namespace, embedding_namespace, text_key

__all__ = ["cached_documents", "embed_through", "encode_cached", "span_key"]


def embed_through(
    texts: Sequence[str],
    ns: Namespace | None,
    compute: Callable[[list[str]], np.ndarray],
    *,
    chunk_size: int = 256,
    progress: Callable[[int], None] | None = None,
    dim: int | None = None,
) -> np.ndarray:
    """Vectors of ``texts`` (in order): dedupe -> chunk -> cache around any ``compute(texts)``.

    Each distinct text is computed once, in chunks of ``chunk_size`` distinct texts; with
    a namespace ``ns`` each chunk is stored whole before the next starts and texts already
    stored are not computed.  ``progress(n)`` is called with the number of distinct texts
    done, the cached ones first.  ``dim`` gives the width of an empty result.
    """
    texts = list(texts)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1; got {chunk_size}")
    if ns is not None:
        keys = [text_key(t) for t in texts]
        if progress is not None:
            n_unique = len(set(keys))
            missing = len(ns.missing(keys))
            if n_unique - missing:
                progress(n_unique - missing)
        return ns.get_or_compute(keys, texts, compute, chunk_size=chunk_size, progress=progress)
    unique = list(dict.fromkeys(texts))
    parts = []
    for start in range(0, len(unique), chunk_size):
        part = unique[start : start + chunk_size]
        parts.append(np.asarray(compute(part), dtype=np.float32))
        if progress is not None:
            progress(len(part))
    if not parts:
        return np.zeros((0, dim or 0), dtype=np.float32)
    index = {t: i for i, t in enumerate(unique)}
    return np.concatenate(parts)[[index[t] for t in texts]]


def _check_texts(texts: Sequence[Any]) -> list[str]:
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text {i} is {type(t).__name__} {t!r}, not a string: posfair embeds only texts")
        if not t.strip():
            raise ValueError(f"text {i} is empty: posfair does not embed empty texts")
    return texts


def encode_cached(
    model: Any,
    texts: Sequence[str],
    store: EmbeddingStore | None = None,
    *,
    calibration: CalibrationChoice = MODEL_DEFAULT,
    prompt: str | None = None,
    batch_size: int = 32,
    chunk_size: int = 256,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Pooled embeddings of ``texts`` (float32, n x dim) through the shared embedding namespace.

    ``calibration``: a Calibration, ``STOCK`` or ``MODEL_DEFAULT`` (the model's own; resolved first,
    so the cache is keyed by what is computed).  Without a store, duplicates are still encoded once.  Texts must be
    non-empty strings (ValueError naming the index otherwise).  ``progress(n)``
    counts distinct texts, the ones already cached first.
    """
    texts = _check_texts(texts)
    calibration = resolved_calibration(model, calibration)
    compute = encoder(model, calibration, prompt=prompt, batch_size=batch_size)
    ns = embedding_namespace(store, model.fingerprint, calibration, prompt) if store is not None else None
    if not callable(getattr(model, "warn_input", None)):
        return embed_through(
            texts, ns, compute, chunk_size=chunk_size, progress=progress, dim=compat.embedding_dimension(model)
        )
    # truncated texts and texts left stock are counted over the caller's input, not over each chunk of the cache's misses
    model.warn_input(texts, calibration, prompt=prompt, stacklevel=3)
    with input_reported():
        return embed_through(
            texts, ns, compute, chunk_size=chunk_size, progress=progress, dim=compat.embedding_dimension(model)
        )


def span_key(doc_text: str, span: tuple[int, int]) -> str:
    """The cache key of the segment at character ``span`` of ``doc_text`` (contextualised segments)."""
    return text_key(doc_text, f"span:{span[0]}:{span[1]}")


def cached_documents(
    ns_doc: Namespace,
    ns_ctx: Namespace | None,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    compute: Callable[[list[str], list[Sequence[tuple[int, int]]]], tuple[np.ndarray, Any]],
    chunk_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Document embeddings (m x dim) and, with ``ns_ctx``, contextualised segments (m x n x dim).

    ``compute(texts, spans)`` returns ``(doc_vectors, ctx_vectors or None)``.  Chunks
    follow a fixed grid over the distinct documents (a chunk with anything missing is
    recomputed whole, so a resumed run batches as an uninterrupted one); the
    contextualised vectors are stored one per ``(document, span)`` key, before the
    document vectors, so a stored document always has its segments stored.
    """
    keys = [text_key(t) for t in texts]
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    uniq = list(first)
    ctx_keys = {k: [span_key(texts[first[k]], sp) for sp in spans[first[k]]] for k in uniq}
    for start in range(0, len(uniq), chunk_size):
        ck = uniq[start : start + chunk_size]
        need = bool(ns_doc.missing(ck))
        if ns_ctx is not None and not need:
            need = bool(ns_ctx.missing([c for k in ck for c in ctx_keys[k]]))
        if not need:
            continue
        docs, ctx = compute([texts[first[k]] for k in ck], [spans[first[k]] for k in ck])
        if ns_ctx is not None:
            if ctx is None:
                raise ValueError("compute returned no contextualised segments but a contextualised store was given")
            ns_ctx.put([c for k in ck for c in ctx_keys[k]], np.concatenate([np.asarray(c) for c in ctx]))
        ns_doc.put(ck, docs)
        if progress is not None:
            progress(len(ck))
    doc_vecs = ns_doc.get(keys)
    if ns_ctx is None:
        return doc_vecs, None
    return doc_vecs, np.stack([ns_ctx.get(ctx_keys[k]) for k in keys])
