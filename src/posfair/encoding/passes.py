"""The forward passes: every call of a model's ``encode`` that posfair makes, and every pass on tokenised features
(:func:`forward_pass`), goes through this module.

* **stock vs calibrated** (:func:`resolved_calibration`, :func:`calibration_kwargs`): every function takes
  ``calibration=`` a :class:`~posfair.Calibration`, ``STOCK`` or ``MODEL_DEFAULT`` (the default, as in
  ``FairModel.encode``: the model's own calibration, stock for a plain sentence-transformers model), resolved
  against the model once, so a cache is keyed by what is computed; a calibration asked of a model that cannot
  calibrate is an error, never a silently stock run;
* **pooled vectors** (:func:`encoder`, :func:`encode_texts`): the audit, retrieval, SEA, sweeps, the tuner and
  ``posfair encode`` (through :mod:`~posfair.encoding.cache`);
* **token states** (:func:`token_outputs`, :func:`encode_documents`): contextualised segments, late chunking and
  ``posfair serve``'s ``/v1/segments``;
* **token-budget batches** (:func:`encode_in_batches`): ``posfair embed``'s shards and ``posfair serve``'s requests,
  sorted by token length so that the same texts give the same vectors whichever of the two encodes them;
* **one pass on tokenised features** (:func:`forward_pass`): the passes that are no ``encode`` call, where the
  caller needs what ``encode`` does not give: the fitted calibration's training (gradients through the pass) and
  the attention profile and prior estimate (the attention rows a recorder captures in the pass);
* **pooling** (:func:`model_pooling`) and **L2 normalisation** (:func:`l2_normalize`).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from posfair.calibration import Calibration
from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice, Resolved, check_choice
from posfair.encoding.batching import Batching, length_aware_batches, padded_tokens
from posfair.model import compat
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "calibration_kwargs",
    "encode_documents",
    "encode_in_batches",
    "encode_texts",
    "encoder",
    "forward_pass",
    "l2_normalize",
    "model_pooling",
    "resolved_calibration",
    "sharing_stock_layers",
    "token_budget_batches",
    "token_outputs",
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
    pooled, tokens = [], []
    for o in token_outputs(model, texts, calibration, batch_size=batch_size):
        valid = o["attention_mask"].bool().cpu().numpy()
        pooled.append(o["sentence_embedding"].float().cpu().numpy())
        tokens.append((o["input_ids"].cpu().numpy()[valid], o["token_embeddings"].float().cpu().numpy()[valid]))
    return np.stack(pooled).astype(np.float32), tokens


def token_outputs(
    model: Any,
    texts: Sequence[str],
    calibration: CalibrationChoice = MODEL_DEFAULT,
    *,
    prompt: str | None = None,
    batch_size: int = 32,
) -> list[dict[str, Any]]:
    """``encode``'s whole output per text (``output_value=None``): a dict of torch tensors, ``sentence_embedding``,
    ``token_embeddings``, ``attention_mask`` and ``input_ids`` (the last three padded to the text's batch)."""
    prompted = {"prompt": prompt} if prompt is not None else {}
    return model.encode(
        list(texts),
        batch_size=batch_size,
        output_value=None,
        convert_to_numpy=False,
        show_progress_bar=False,
        **prompted,
        **calibration_kwargs(model, calibration),
    )


def forward_pass(model: Any, features: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """``model``'s forward pass on tokenised ``features`` (as ``encode`` feeds it: ``input_ids``, ``attention_mask``,
    ...), its tensors moved to ``device`` (default the model's); the model's output features
    (``sentence_embedding``, ``token_embeddings``, ...).

    Unlike ``encode``, nothing is set around the pass: no ``torch.no_grad`` (a training step takes gradients
    through it), no calibration (the caller's ``model.using(...)`` or ``calibration_override`` block sets it),
    and the caller's attention recorder, if any, sees the pass's attention."""
    device = model.device if device is None else device
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
    return model(moved)


def token_budget_batches(
    model: Any, texts: Sequence[str], *, prompt: str | None, batching: Batching, max_batch_tokens: int, batch_size: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """The batches :func:`encode_in_batches` encodes ``texts`` in, and each text's token length (prompt and special
    tokens included, after truncation; a warning counts the texts truncated).  ``batching="length"``: sorted by token
    length, each batch's padded tokens within ``max_batch_tokens`` and at most ``batch_size`` texts
    (:func:`~posfair.encoding.batching.length_aware_batches`); ``"fixed"``: sentence-transformers' own batching
    (sorted by character length, ``batch_size`` texts)."""
    full = [(prompt or "") + t for t in texts]
    raw = model.token_lengths(full)
    limit = model.max_seq_length
    lengths = np.minimum(raw, limit) if limit else raw
    over = int((raw > lengths).sum())
    if over:
        warnings.warn(
            f"{over} of {len(texts)} texts are longer than max_seq_length={limit} tokens and are truncated",
            stacklevel=user_stacklevel(),
        )
    if batching == "length":
        return length_aware_batches(lengths, max_batch_tokens, batch_size), lengths
    order = np.argsort([-len(t) for t in full], kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)], lengths


def _encode_batch(
    model: Any, texts: list[str], calibration: Resolved, prompt: str | None, batch_size: int
) -> np.ndarray:
    # as FairModel.encode(calibration=...), minus its per-call re-tokenising checks (the batches are chosen here)
    with model.using(calibration):
        out = SentenceTransformer.encode(
            model, texts, prompt=prompt, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
        )
    return np.asarray(out, dtype=np.float32)


def encode_in_batches(
    model: Any,
    texts: Sequence[str],
    calibration: Resolved,
    *,
    prompt: str | None = None,
    batching: Batching = "length",
    max_batch_tokens: int = 16384,
    batch_size: int = 32,
) -> tuple[np.ndarray, dict[str, int]]:
    """Pooled embeddings of ``texts`` (in order) encoded by a posfair model in :func:`token_budget_batches`, and the
    token counts ``{"tokens", "padded"}``: ``posfair embed``'s shards and ``posfair serve``'s requests.
    ``calibration`` is a Calibration or ``STOCK``, never "whatever the model carries"."""
    texts = list(texts)
    batches, lengths = token_budget_batches(
        model, texts, prompt=prompt, batching=batching, max_batch_tokens=max_batch_tokens, batch_size=batch_size
    )
    if batching == "fixed":
        vectors = _encode_batch(model, texts, calibration, prompt, batch_size)
    else:
        vectors = np.zeros((len(texts), compat.embedding_dimension(model)), dtype=np.float32)
        for b in batches:
            vectors[b] = _encode_batch(model, [texts[i] for i in b], calibration, prompt, len(b))
    real, padded = padded_tokens(lengths, batches)
    return vectors, {"tokens": real, "padded": padded}
