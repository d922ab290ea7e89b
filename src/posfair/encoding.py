"""Encoding with the cache: the one layer every area embeds texts through.

The audit's segments and documents, the retrieval queries and documents, SEA's
chunks, sweeps, the tuner and ``posfair encode`` all call this module; none of
them calls ``model.encode`` itself.  It owns four decisions that used to be
made in several places:

* **stock vs calibrated** (:func:`resolved_calibration`, :func:`calibration_kwargs`): every
  function takes ``calibration=`` a :class:`~posfair.Calibration`, ``STOCK`` or ``MODEL_DEFAULT``
  (the default, as in ``FairModel.encode``: the model's own calibration, stock for a plain
  sentence-transformers model), resolved against the model once, so the cache is keyed by
  what is computed; a calibration asked of a model that cannot calibrate is an error, never
  a silently stock run;
* **dedupe -> chunk -> cache** (:func:`embed_through`): each distinct text is
  computed once, in chunks of ``chunk_size`` written whole and atomically to
  the store, so a killed run loses at most one chunk and a resumed run batches
  exactly as an uninterrupted one (bit-identical vectors);
* **pooling** (:func:`model_pooling`): the pooling name of any
  sentence-transformers model (``cls``, ``mean``, ``lasttoken``);
* **L2 normalisation** (:func:`l2_normalize`).

Embeddings are cached exactly as the model returns them (float32, not
normalised); consumers normalise when they need to.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from posfair.calibration import Calibration
from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice, Resolved, check_choice
from posfair.model import compat, input_reported, token_limit
from posfair.store import EmbeddingStore, Namespace, embedding_namespace, text_key

__all__ = [
    "resolved_calibration",
    "calibration_kwargs",
    "l2_normalize",
    "model_pooling",
    "model_tokenizer",
    "default_prompt",
    "PromptedTokenizer",
    "model_limit",
    "max_seq_length",
    "encoder",
    "encode_texts",
    "encode_documents",
    "embed_through",
    "encode_cached",
    "span_key",
    "cached_documents",
]


def _calibrates(model: Any) -> bool:
    """Does ``model.encode`` take a ``calibration`` (a posfair model)?"""
    return (
        callable(getattr(model, "set_calibration", None)) or "calibration" in inspect.signature(model.encode).parameters
    )


def resolved_calibration(model: Any, calibration: CalibrationChoice = MODEL_DEFAULT) -> Resolved:
    """What ``model`` encodes with for ``calibration``: a Calibration or STOCK (``MODEL_DEFAULT`` is
    the model's own calibration; a plain sentence-transformers model has none).  A Calibration asked
    of a model that cannot calibrate raises TypeError instead of stock embeddings under a calibrated label."""
    calibration = check_choice(calibration)
    if callable(
        getattr(model, "resolve_calibration", None)
    ):  # a FairModel (MODEL_DEFAULT: its own, or a using() block's)
        return model.resolve_calibration(calibration)
    if _calibrates(model):
        return calibration
    if isinstance(calibration, Calibration):
        raise TypeError(f"{type(model).__name__}.encode takes no calibration: load the model with posfair.load_model()")
    return STOCK


def calibration_kwargs(model: Any, calibration: CalibrationChoice = MODEL_DEFAULT) -> dict[str, Any]:
    """The ``encode`` keywords that make ``model`` encode with ``calibration`` resolved (see
    :func:`resolved_calibration`): ``{"calibration": ...}`` for a posfair model, ``{}`` for a plain one."""
    resolved = resolved_calibration(model, calibration)
    return {"calibration": resolved} if _calibrates(model) else {}


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """``x`` with each vector (last axis) scaled to unit length; zero vectors stay zero."""
    x = np.asarray(x)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def default_prompt(model: Any) -> str:
    """The prompt ``encode`` prepends when none is given (the model's default prompt; "" for most models,
    "passage: " for the bundled multilingual-e5-small)."""
    return (compat.resolve_prompt(model, None, None) or "") if hasattr(model, "prompts") else ""


class PromptedTokenizer:
    """A tokenizer that sees texts as ``encode`` does: the model's default prompt in front of every text
    encoded whole (``add_special_tokens=True``), with character offsets reported relative to the text
    itself (tokens lying inside the prompt get the empty offset (0, 0), like special tokens).  So token
    counts include the prompt, as the token limit does, and spans over the text need no shifting.
    Texts tokenised without special tokens (segment lengths) are tokenised without the prompt too."""

    def __init__(self, tokenizer: Any, prompt: str):
        self.tokenizer, self.prompt = tokenizer, prompt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def __call__(self, text: Any, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if add_special_tokens:
            text = self.prompt + text if isinstance(text, str) else [self.prompt + t for t in text]
        enc = self.tokenizer(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        if add_special_tokens and "offset_mapping" in enc:
            enc["offset_mapping"] = _shift_offsets(enc["offset_mapping"], len(self.prompt))
        return enc


def _shift_offsets(offsets: Any, shift: int) -> Any:
    if isinstance(offsets, torch.Tensor):
        out = (offsets - shift).clamp(min=0)
        out[offsets[..., 1] <= shift] = 0
        return out
    if offsets and isinstance(offsets[0], tuple):  # one text
        return [(max(a - shift, 0), b - shift) if b > shift else (0, 0) for a, b in offsets]
    return [_shift_offsets(o, shift) for o in offsets]


def model_tokenizer(model: Any) -> Any:
    """The model's tokenizer as ``encode`` applies it: with the model's default prompt in front, if it
    has one (:class:`PromptedTokenizer`).  ValueError if the model exposes no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"model {type(model).__name__} exposes no tokenizer; token spans need one")
    prompt = default_prompt(model)
    return PromptedTokenizer(tok, prompt) if prompt else tok


def model_limit(model: Any, max_seq_length: int | None = None) -> int:
    """The token limit texts are encoded with: :func:`posfair.model.token_limit`, the one rule of
    every posfair command (``max_seq_length`` if given, else the model's configured one, never
    above its position limit)."""
    return token_limit(model, max_seq_length)


@contextlib.contextmanager
def sharing_stock_layers(model: Any, calibrations: Sequence[Any], into: Any = None) -> Iterator[Any]:
    """``model.sharing_stock_layers(calibrations, into=into)`` (``posfair.model.stock_layers``) for a posfair model; for
    any other model, or with nothing to share, a block that shares nothing (yields None).  Encode stock first, then
    the calibrations, on the same texts."""
    share = getattr(model, "sharing_stock_layers", None)
    if share is None or (into is None and not calibrations):
        yield None
        return
    with share(calibrations, into=into) as counts:
        yield counts


@contextlib.contextmanager
def max_seq_length(model: Any, length: int) -> Iterator[None]:
    """Within the block, ``model.max_seq_length`` is ``length`` (restored after, also on error)."""
    old = getattr(model, "max_seq_length", None)
    model.max_seq_length = length
    try:
        yield
    finally:
        if old is not None:
            model.max_seq_length = old


def model_pooling(model: Any) -> str:
    """``cls``, ``mean`` or ``lasttoken``: a posfair model's ``pooling``, else its Pooling module's mode."""
    p = getattr(model, "pooling", None)
    if isinstance(p, str):
        return p
    for module in model if hasattr(model, "__iter__") else []:
        name = compat.pooling_name(module)
        if name is not None:
            return name
    raise ValueError(f"cannot determine the pooling of {type(model).__name__}: it has no Pooling module")


def encoder(
    model: Any,
    calibration: CalibrationChoice = MODEL_DEFAULT,
    *,
    prompt: str | None = None,
    batch_size: int = 32,
    **encode_kwargs: Any,
) -> Callable[[list[str]], np.ndarray]:
    """A function embedding a list of texts (float32, n x dim) with ``model`` as configured here."""
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False, **encode_kwargs
    )
    if prompt:
        kwargs["prompt"] = prompt
    kwargs.update(calibration_kwargs(model, calibration))

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(list(texts), **kwargs), dtype=np.float32)

    return encode


def encode_texts(
    model: Any,
    texts: Sequence[str],
    calibration: CalibrationChoice = MODEL_DEFAULT,
    *,
    prompt: str | None = None,
    batch_size: int = 32,
) -> np.ndarray:
    """Pooled embeddings of ``texts`` (float32, n x dim), no cache."""
    return encoder(model, calibration, prompt=prompt, batch_size=batch_size)(list(texts))


def encode_documents(
    model: Any,
    texts: Sequence[str],
    calibration: CalibrationChoice = MODEL_DEFAULT,
    *,
    batch_size: int = 32,
    with_tokens: bool = True,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Pooled embeddings plus, per text, ``(input_ids, token_states)`` with padding removed
    (``with_tokens=False``: the pooled embeddings and an empty list)."""
    if not with_tokens:
        return encode_texts(model, texts, calibration, batch_size=batch_size), []
    outs = model.encode(
        list(texts),
        batch_size=batch_size,
        output_value=None,
        convert_to_numpy=False,
        show_progress_bar=False,
        **calibration_kwargs(model, calibration),
    )
    pooled, tokens = [], []
    for o in outs:
        valid = o["attention_mask"].bool().cpu().numpy()
        pooled.append(o["sentence_embedding"].float().cpu().numpy())
        tokens.append((o["input_ids"].cpu().numpy()[valid], o["token_embeddings"].float().cpu().numpy()[valid]))
    return np.stack(pooled).astype(np.float32), tokens


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
