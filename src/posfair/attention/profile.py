"""Attention diagnosis: the pooling token's attention profile over the document.

For every document the pooling token's post-softmax attention row is recorded
(CLS models: the first token's row; last-token models: the last token's row;
mean-pooled models: the mean over all valid query rows, labelled "mean over
query rows"), averaged over heads.  The row is summarised in four *views*:

``special``  the BOS key (first valid key, when it is a special token) and the
             EOS key (last valid key, when it is a special token), reported
             apart so they do not distort the first and last basket;
``basket``   the content keys (between BOS and EOS) in consecutive baskets of
             ``basket_size`` keys, starting at the first content key (the last
             basket of a document may be shorter);
``bin``      the content keys in ``n_bins`` bins of relative position (key
             ``i`` of ``C`` content keys falls into bin ``floor((i + 0.5) / C * n_bins)``),
             so documents of different lengths aggregate cleanly;
``segment``  the mass on each segment position (when segment character spans
             are given), which lines up with the audit's sigma profile.

Aggregation streams: :class:`AttentionProfile` keeps running sums and sums of
squares per view cell, per layer (for the layer x basket heat map) and for the
chosen layer set (default: the last half of the layers), plus the number of
documents that have each cell (a 3-basket document contributes nothing to
basket 4), so means and standard errors are exact.

A calibrated profile records how many of its documents the calibration
actually changed (``n_calibrated``, :attr:`AttentionProfile.calibrated_share`;
the rule of :mod:`posfair.calibration.coverage`): a profile with share 0 is
the stock profile and the figures label it as a no-op instead of drawing it.  Only one pooling row per
layer and document of the current batch is ever held.

This module runs the model (:func:`attention_profile`); the profile object is
:mod:`posfair.attention.record`, the views :mod:`posfair.attention.views`,
the figures and the report section :mod:`posfair.attention.render`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from posfair.attention.record import AttentionProfile
from posfair.calibration.choice import STOCK, Stock, check_choice
from posfair.calibration.coverage import CalibrationFallbackWarning, calibration_coverage
from posfair.calibration.params import Calibration
from posfair.encoding import model_tokenizer
from posfair.encoding.passes import forward_pass
from posfair.model import FairModel
from posfair.model.token_spans import token_segment_index
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import progress_enabled
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "AttentionProfile",
    "attention_profile",
    "resolve_layers",
    "LayerSpec",
]

log = logging.getLogger(__name__)

LayerSpec = None | int | float | Sequence[int]


def resolve_layers(layers: LayerSpec, num_layers: int) -> tuple[int, ...]:
    """0-based layer indices: None = the last half; int k = the last k; float f = the last
    ``max(1, floor(f * N))``; a sequence = explicit indices (ValueError if outside the model)."""
    spec = 0.5 if layers is None else layers
    if isinstance(spec, (list, tuple)):
        bad = [
            i
            for i in spec
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= int(i) < num_layers
        ]
        if bad:
            raise PosfairInputError(
                f"layers {bad} out of range: the model has {num_layers} layers (valid indices 0..{num_layers - 1})"
            )
        spec = tuple(int(i) for i in spec)
    return Calibration(layers=spec).layer_indices(num_layers)


# -- computing profiles from a model --------------------------------------------------------------
def _doc_inputs(documents, segments):
    texts, spans = [], []
    for i, d in enumerate(documents):
        if isinstance(d, str):
            texts.append(d)
            spans.append(None)
        elif hasattr(d, "text"):
            texts.append(d.text)
            spans.append(tuple(getattr(d, "spans", ()) or ()) or None)
        else:
            raise TypeError(f"document {i} must be a string or have a .text attribute; got {type(d).__name__}")
        if not texts[-1].strip():
            raise PosfairInputError(f"document {i} is empty")
    if segments is not None:
        if len(segments) != len(texts):
            raise PosfairInputError(f"segments has {len(segments)} entries for {len(texts)} documents")
        spans = [None if s is None else tuple((int(a), int(b)) for a, b in s) for s in segments]
    return texts, spans


def attention_profile(
    model: FairModel,
    documents: Sequence[Any],
    *,
    segments: Sequence[Sequence[tuple[int, int]]] | None = None,
    layers: LayerSpec = None,
    basket_size: int = 128,
    n_bins: int = 20,
    calibration: Calibration | Stock = STOCK,
    batch_size: int = 8,
    queries: str | None = None,
    label: str | None = None,
    group: str = "",
    model_name: str = "",
    progress: Callable[[int], None] | None = None,
    show_progress_bar: bool | None = None,
) -> AttentionProfile:
    """The pooling token's attention profile of ``model`` over ``documents``.

    Args:
        model: a :class:`posfair.FairModel`.
        documents: texts, or objects with ``.text`` (and ``.spans``, e.g. the audit's
            :class:`~posfair.fairness.documents.Document`, whose spans become segments).
        segments: per document, the ``[start, end)`` character spans of its segments
            (overrides ``.spans``); enables the per-segment view.
        layers: the layer set averaged in the profile: None = the last half; int k = the
            last k; float f = a fraction; a sequence = 0-based indices.
        basket_size, n_bins: absolute basket size (content keys) and relative bins.
        calibration: a :class:`posfair.Calibration`, or ``posfair.STOCK`` (default) for the stock model.
        queries: "pool" (the pooling token's row) or "all" (mean over valid query
            rows); default "all" for mean-pooled models, else "pool".
        progress: called with the number of documents done after each batch (e.g. to drive a
            progress bar of the caller's).
        show_progress_bar: a tqdm bar over the documents when no ``progress`` is given; None =
            shown when this module's logger is at INFO or DEBUG (as sentence-transformers does).

    Raises ValueError for layers outside the model, ``basket_size < 1`` and documents
    longer than the model's ``max_seq_length`` (they would be truncated).
    """
    _check_sizes(basket_size, batch_size)
    chosen = resolve_layers(layers, model.num_layers)
    queries = _resolve_queries(model, queries)
    texts, spans = _doc_inputs(documents, segments)
    tok = model_tokenizer(model)  # the model's default prompt in front, as encode has it
    lengths = _lengths_within_limit(model, tok, texts)
    calibration = check_choice(calibration, model_default=False)
    n_calibrated = None if calibration is STOCK else _calibrated_count(model, calibration, lengths, label)
    profile = AttentionProfile(
        num_layers=model.num_layers,
        layers=chosen,
        basket_size=int(basket_size),
        n_bins=n_bins,
        pooling=model.pooling or "cls",
        queries=queries,
        label=calibration.label() if label is None else label,
        group=group,
        model=model_name,
        fingerprint=model.fingerprint,
        token_limit=int(model.max_seq_length or model.position_limit or 0),
        calibration=None if calibration is STOCK else calibration.to_dict(),
        n_calibrated=n_calibrated,
    )
    _record_profile(model, calibration, profile, tok, texts, spans, batch_size, progress, show_progress_bar)
    return profile


def _check_sizes(basket_size: Any, batch_size: int) -> None:
    """PosfairInputError for a basket size that is not an integer >= 1 or a batch size < 1."""
    if isinstance(basket_size, bool) or not isinstance(basket_size, (int, np.integer)) or basket_size < 1:
        raise PosfairInputError(f"basket_size must be an integer >= 1; got {basket_size!r}")
    if batch_size < 1:
        raise PosfairInputError(f"batch_size must be >= 1; got {batch_size}")


def _resolve_queries(model: FairModel, queries: str | None) -> str:
    """The query rows recorded: as given, else "all" for a mean-pooled model and "pool" for the others."""
    queries = queries or ("all" if (model.pooling or "cls") == "mean" else "pool")
    if queries not in ("pool", "all"):
        raise PosfairInputError(f"queries must be 'pool' or 'all'; got {queries!r}")
    return queries


class _BatchRows:
    """The attention recorder of the model's passes: one batch's rows of every layer, averaged over heads."""

    def __init__(self, num_layers: int):
        self.every = list(range(num_layers))
        self.rows: dict[int, np.ndarray] = {}

    def __call__(self, layer: int, rows) -> None:
        self.rows[layer] = rows.float().mean(1).double().cpu().numpy()  # (B, K)

    def run(self, model: FairModel, tok, batch: list[str], device) -> tuple[np.ndarray, Any]:
        """Run ``model`` on ``batch``: the rows of every layer (L, B, K) and the batch's encoding; RuntimeError when
        the pass left a layer unrecorded."""
        enc = tok(
            batch,
            padding=True,
            truncation=False,
            return_tensors="pt",
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        features = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        features["modality"] = "text"
        self.rows.clear()
        forward_pass(model, features, device)  # under the caller's calibration and attention recorder
        missing = [layer for layer in self.every if layer not in self.rows]
        if missing:
            raise RuntimeError(f"the attention recorder saw no rows for layers {missing}")
        return np.stack([self.rows[layer] for layer in self.every]), enc


def _record_profile(
    model: FairModel,
    calibration: Calibration | Stock,
    profile: AttentionProfile,
    tok,
    texts: list[str],
    spans: list,
    batch_size: int,
    progress: Callable[[int], None] | None,
    show_progress_bar: bool | None,
) -> None:
    """Run ``model`` under ``calibration`` over ``texts`` in batches, adding each batch's rows to ``profile``."""
    name = f"{profile.label}" + (f" ({profile.group})" if profile.group else "")
    log.info(
        "attention profile %s: %d documents, layers %s of %d", name, len(texts), list(profile.layers), model.num_layers
    )
    device = next(model.parameters()).device
    recorder = _BatchRows(model.num_layers)
    bar = None
    if progress is None and progress_enabled(show_progress_bar, log):
        bar = tqdm(total=len(texts), desc=f"attention {name}", unit="doc")
        progress = bar.update
    with (
        torch.no_grad(),
        model.using(calibration),
        model.recording_attention(recorder, recorder.every, queries=profile.queries),
        bar if bar is not None else contextlib.nullcontext(),
    ):
        for b0 in range(0, len(texts), batch_size):
            batch = texts[b0 : b0 + batch_size]
            rows, enc = recorder.run(model, tok, batch, device)
            _add_batch(profile, rows, enc, spans[b0 : b0 + len(batch)])
            if progress is not None:
                progress(len(batch))


def _lengths_within_limit(model: FairModel, tok, texts: list[str]) -> np.ndarray:
    """Each document's tokens as encode sees them (prompt and special tokens included); PosfairInputError for a
    document longer than the model's limit (its profile would be of a truncated text)."""
    limit = model.max_seq_length or model.position_limit
    if not texts:
        return np.zeros(0, dtype=np.int64)
    lengths = np.array([len(ids) for ids in tok(texts, truncation=False)["input_ids"]], dtype=np.int64)
    over = np.nonzero(lengths > limit)[0] if limit else np.zeros(0, dtype=np.int64)
    if over.size:
        i = int(over[0])
        raise PosfairInputError(
            f"{over.size} document(s) are longer than the model's limit of {limit} tokens (first: document {i}, "
            f"{int(lengths[i])} tokens); they would be truncated. Use shorter documents or raise max_seq_length "
            f"(position limit {model.position_limit})"
        )
    return lengths


def _calibrated_count(model: FairModel, calibration: Calibration, lengths: np.ndarray, label: str | None) -> int:
    """How many documents ``calibration`` changes (no truncation: the lengths are the spans); one warning if not all."""
    coverage = calibration_coverage(model.transformer_module.resolve(calibration), lengths)
    if coverage.message():
        warnings.warn(
            f"attention profile {label or calibration.label()}: {coverage.message()}",
            CalibrationFallbackWarning,
            stacklevel=user_stacklevel(),
        )
    return coverage.calibrated


def _add_batch(profile: AttentionProfile, rows: np.ndarray, enc, spans: Sequence) -> None:
    """Add one batch's recorded rows (layers x batch x keys) to ``profile``: each document's valid span, its special
    tokens and, with character spans, the segment of each token; the largest mass on padding is kept (a check)."""
    mask = enc["attention_mask"].numpy().astype(bool)
    special = enc["special_tokens_mask"].numpy().astype(bool)
    offsets = enc["offset_mapping"].numpy()
    for j in range(rows.shape[1]):
        valid = np.nonzero(mask[j])[0]
        s, e = int(valid[0]), int(valid[-1])
        pad = rows[:, j, ~mask[j]]
        if pad.size:
            profile.max_padding_mass = max(profile.max_padding_mass, float(np.abs(pad).max()))
        seg = None if spans[j] is None else token_segment_index(offsets[j, s : e + 1], spans[j], special[j, s : e + 1])
        profile.add_document(
            rows[:, j, s : e + 1],
            has_bos=bool(special[j, s]),
            has_eos=bool(special[j, e]) and e > s,
            token_segments=seg,
        )
