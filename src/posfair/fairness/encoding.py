"""Model adapters and cached encoding for the audit.

Every embedding goes through :class:`posfair.store.EmbeddingStore`, keyed by the
model fingerprint, the calibration key and the text.  Missing vectors are
computed on a *fixed grid* of chunks over the deduplicated key list: a chunk
with any missing key is recomputed whole, so a run killed at any moment and
resumed encodes every text in exactly the same batch as an uninterrupted run
and produces bit-identical results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from posfair.store import Namespace, text_key

__all__ = [
    "model_fingerprint",
    "model_limit",
    "model_pooling",
    "model_tokenizer",
    "max_seq_length",
    "encode_texts",
    "encode_documents",
    "cached_texts",
    "cached_documents",
]

STOCK = "stock"


def model_tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"model {type(model).__name__} exposes no tokenizer; the audit needs one for token spans")
    return tok


def model_limit(model, max_seq_length: int | None = None) -> int:
    """The token limit the audit encodes with (see :func:`posfair.model.token_limit`: the one
    rule every posfair command follows — ``max_seq_length`` if given, else the model's
    configured ``max_seq_length``, never above its position limit)."""
    from posfair.model import token_limit

    return token_limit(model, max_seq_length)


def model_pooling(model) -> str:
    """'cls', 'mean' or 'lasttoken' (FairModel attribute, else the ST Pooling module)."""
    p = getattr(model, "pooling", None)
    if isinstance(p, str):
        return p
    for module in model if hasattr(model, "__iter__") else []:
        mode = getattr(module, "pooling_mode", None)
        if isinstance(mode, str):
            return {"cls": "cls", "mean": "mean", "lasttoken": "lasttoken", "last_token": "lasttoken"}.get(mode, mode)
        get = getattr(module, "get_pooling_mode_str", None)
        if callable(get):
            return get()
    raise ValueError("cannot determine the model's pooling strategy")


def model_fingerprint(model) -> str:
    """The model's cache identity (see :func:`posfair.model.model_fingerprint`)."""
    from posfair.model import model_fingerprint as shared

    return shared(model)


@contextlib.contextmanager
def max_seq_length(model, length: int) -> Iterator[None]:
    """Temporarily set ``model.max_seq_length``."""
    old = getattr(model, "max_seq_length", None)
    model.max_seq_length = length
    try:
        yield
    finally:
        if old is not None:
            model.max_seq_length = old


def _encode_kwargs(model, calibration) -> dict[str, Any]:
    if calibration is not None:
        if not callable(getattr(model, "set_calibration", None)):
            raise ValueError(f"{type(model).__name__} does not support attention calibration; load the model with posfair.load_model()")
        return {"calibration": calibration}
    # a FairModel may carry a default calibration: the audit's stock run must be the stock model
    return {"calibration": False} if callable(getattr(model, "set_calibration", None)) else {}


def encode_texts(model, texts: Sequence[str], calibration=None, batch_size: int = 16) -> np.ndarray:
    """Pooled embeddings (float32, n x dim)."""
    out = model.encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False, **_encode_kwargs(model, calibration)
    )
    return np.asarray(out, dtype=np.float32)


def encode_documents(
    model,
    texts: Sequence[str],
    calibration=None,
    batch_size: int = 16,
    with_tokens: bool = True,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Pooled embeddings plus, per text, ``(input_ids, token_states)`` with padding removed."""
    if not with_tokens:
        return encode_texts(model, texts, calibration, batch_size), []
    outs = model.encode(
        list(texts),
        batch_size=batch_size,
        output_value=None,
        convert_to_numpy=False,
        show_progress_bar=False,
        **_encode_kwargs(model, calibration),
    )
    pooled, tokens = [], []
    for o in outs:
        valid = o["attention_mask"].bool().cpu().numpy()
        pooled.append(o["sentence_embedding"].float().cpu().numpy())
        tokens.append((o["input_ids"].cpu().numpy()[valid], o["token_embeddings"].float().cpu().numpy()[valid]))
    return np.stack(pooled).astype(np.float32), tokens


def _grid(keys: Sequence[str], chunk_size: int) -> tuple[list[str], list[list[int]]]:
    """Deduplicated keys (first-seen order) and a fixed chunk grid over them."""
    uniq, first = [], {}
    for i, k in enumerate(keys):
        if k not in first:
            first[k] = i
            uniq.append(k)
    chunks = [list(range(s, min(s + chunk_size, len(uniq)))) for s in range(0, len(uniq), chunk_size)]
    return uniq, chunks


def cached_texts(
    ns: Namespace,
    texts: Sequence[str],
    compute: Callable[[list[str]], np.ndarray],
    chunk_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Embeddings of ``texts`` from ``ns``, computing the missing ones with ``compute``.

    Chunks are written whole and atomically, so after a kill the missing keys
    are whole chunks again: a resumed run batches exactly like an uninterrupted one.
    """
    return ns.get_or_compute([text_key(t) for t in texts], list(texts), compute, chunk_size=chunk_size, progress=progress)


def span_key(doc_text: str, span: tuple[int, int]) -> str:
    return text_key(doc_text, f"span:{span[0]}:{span[1]}")


def cached_documents(
    ns_doc: Namespace,
    ns_ctx: Namespace | None,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    compute: Callable[[list[str], list[Sequence[tuple[int, int]]]], tuple[np.ndarray, np.ndarray | None]],
    chunk_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Document embeddings (m x dim) and, with ``ns_ctx``, contextualised segments (m x n x dim).

    ``compute(texts, spans)`` returns ``(doc_vectors, ctx_vectors or None)``; the
    contextualised vectors are stored one per ``(document, span)`` key, before
    the document vectors, so a stored document always has its segments stored.
    """
    keys = [text_key(t) for t in texts]
    uniq, chunks = _grid(keys, chunk_size)
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    ctx_keys = {k: [span_key(texts[first[k]], sp) for sp in spans[first[k]]] for k in uniq}
    for chunk in chunks:
        ck = [uniq[i] for i in chunk]
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
    ctx_vecs = np.stack([ns_ctx.get(ctx_keys[k]) for k in keys])
    return doc_vecs, ctx_vecs
