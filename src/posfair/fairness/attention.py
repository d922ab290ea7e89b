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
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd

from posfair.io import atomic_write, atomic_write_parquet

__all__ = ["AttentionProfile", "attention_profile", "resolve_layers", "query_label", "VIEWS"]

VIEWS = ("special", "basket", "bin", "segment")
SPECIAL_NAMES = ("BOS", "EOS")
Z95 = 1.959963984540054
LayerSpec = Union[None, int, float, Sequence[int]]


def resolve_layers(layers: LayerSpec, num_layers: int) -> tuple[int, ...]:
    """0-based layer indices: None = the last half; int k = the last k; float f = the last
    ``max(1, floor(f * N))``; a sequence = explicit indices (ValueError if outside the model)."""
    from posfair.calibration.params import Calibration

    spec = 0.5 if layers is None else layers
    if isinstance(spec, (list, tuple)):
        bad = [i for i in spec if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= int(i) < num_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has {num_layers} layers (valid indices 0..{num_layers - 1})")
        spec = tuple(int(i) for i in spec)
    return Calibration(layers=spec).layer_indices(num_layers)


def query_label(pooling: str, queries: str) -> str:
    """How the recorded row was obtained, for tables and figure captions."""
    if queries == "all":
        return "mean over query rows"
    return {
        "cls": "pooling token (first token) row",
        "lasttoken": "pooling token (last token) row",
        "mean": "first token row (the model is mean-pooled)",
    }.get(pooling, f"{pooling} pooling token row")


@dataclass
class _Running:
    """Running sums for one view: per layer (L, n) and for the layer set (n,)."""

    n_layers: int
    sum: np.ndarray = None  # type: ignore[assignment]
    sumsq: np.ndarray = None  # type: ignore[assignment]
    set_sum: np.ndarray = None  # type: ignore[assignment]
    set_sumsq: np.ndarray = None  # type: ignore[assignment]
    count: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.sum is None:
            self.sum = np.zeros((self.n_layers, 0))
            self.sumsq = np.zeros((self.n_layers, 0))
            self.set_sum = np.zeros(0)
            self.set_sumsq = np.zeros(0)
            self.count = np.zeros(0, dtype=np.int64)

    @property
    def width(self) -> int:
        return int(self.count.shape[0])

    def grow(self, n: int) -> None:
        extra = n - self.width
        if extra <= 0:
            return
        self.sum = np.pad(self.sum, ((0, 0), (0, extra)))
        self.sumsq = np.pad(self.sumsq, ((0, 0), (0, extra)))
        self.set_sum = np.pad(self.set_sum, (0, extra))
        self.set_sumsq = np.pad(self.set_sumsq, (0, extra))
        self.count = np.pad(self.count, (0, extra))

    def add(self, per_layer: np.ndarray, set_vals: np.ndarray, present: np.ndarray) -> None:
        """One document: ``per_layer`` (L, n), ``set_vals`` (n,), ``present`` (n,) bool."""
        n = per_layer.shape[1]
        self.grow(n)
        p = present.astype(np.float64)
        self.sum[:, :n] += per_layer * p
        self.sumsq[:, :n] += per_layer**2 * p
        self.set_sum[:n] += set_vals * p
        self.set_sumsq[:n] += set_vals**2 * p
        self.count[:n] += present.astype(np.int64)

    def merge(self, other: _Running) -> None:
        self.grow(other.width)
        n = other.width
        self.sum[:, :n] += other.sum
        self.sumsq[:, :n] += other.sumsq
        self.set_sum[:n] += other.set_sum
        self.set_sumsq[:n] += other.set_sumsq
        self.count[:n] += other.count

    def stats(self, layer: int | None = None) -> dict[str, np.ndarray]:
        """mean, std (sample), sem, 95% interval and count per cell (layer None = the layer set)."""
        s, ss = (self.set_sum, self.set_sumsq) if layer is None else (self.sum[layer], self.sumsq[layer])
        n = self.count.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(n > 0, s / np.maximum(n, 1), np.nan)
            var = np.where(n > 1, (ss - n * np.nan_to_num(mean) ** 2) / np.maximum(n - 1, 1), np.nan)
            std = np.sqrt(np.clip(var, 0.0, None))
            sem = np.where(n > 1, std / np.sqrt(np.maximum(n, 1)), np.nan)
        half = Z95 * np.nan_to_num(sem)
        return {"mean": mean, "std": std, "sem": sem, "lo": mean - half, "hi": mean + half, "count": self.count.copy()}


@dataclass
class AttentionProfile:
    """Streaming accumulator of pooling-token attention mass (see the module docstring).

    ``layers`` is the chosen layer set (0-based) averaged in the headline views;
    per-layer sums cover every layer of the model (``num_layers``).
    """

    num_layers: int
    layers: tuple[int, ...]
    basket_size: int = 128
    n_bins: int = 20
    pooling: str = "cls"
    queries: str = "pool"
    label: str = "stock"
    group: str = ""
    model: str = ""
    fingerprint: str = ""
    calibration: dict | None = None
    n_calibrated: int | None = None  # documents the calibration changed (None: stock profile)
    n_docs: int = 0
    max_total_error: float = 0.0  # max |sum of a document's row over its valid keys - 1|
    max_padding_mass: float = 0.0  # max mass any padding key received
    views: dict[str, _Running] = field(default_factory=dict)
    segment_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if isinstance(self.basket_size, bool) or not isinstance(self.basket_size, (int, np.integer)) or self.basket_size < 1:
            raise ValueError(f"basket_size must be an integer >= 1; got {self.basket_size!r}")
        if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, (int, np.integer)) or self.n_bins < 1:
            raise ValueError(f"n_bins must be an integer >= 1; got {self.n_bins!r}")
        bad = [l for l in self.layers if not 0 <= l < self.num_layers]
        if bad or not self.layers:
            raise ValueError(f"layers {list(self.layers)} invalid: the model has {self.num_layers} layers (0..{self.num_layers - 1})")
        self.layers = tuple(int(l) for l in self.layers)
        for v in VIEWS:
            self.views.setdefault(v, _Running(self.num_layers))
        self.views["special"].grow(len(SPECIAL_NAMES))
        self.views["bin"].grow(self.n_bins)

    # -- accumulation --------------------------------------------------------------------------
    @property
    def query_label(self) -> str:
        return query_label(self.pooling, self.queries)

    def add_document(
        self,
        row: np.ndarray,
        *,
        has_bos: bool,
        has_eos: bool,
        token_segments: np.ndarray | None = None,
    ) -> None:
        """Add one document: ``row`` (num_layers, n_valid) head-averaged mass over its valid keys
        (padding removed); ``token_segments`` (n_valid,) = segment index per key or -1."""
        row = np.asarray(row, dtype=np.float64)
        if row.ndim != 2 or row.shape[0] != self.num_layers:
            raise ValueError(f"row must have shape (num_layers={self.num_layers}, keys); got {row.shape}")
        sel = list(self.layers)
        n_valid = row.shape[1]
        has_eos = bool(has_eos) and n_valid > int(bool(has_bos))
        c0, c1 = int(bool(has_bos)), n_valid - int(has_eos)
        content = row[:, c0:c1]
        C = content.shape[1]
        self.max_total_error = max(self.max_total_error, float(np.abs(row[sel].sum(1) - 1.0).max()))

        special = np.zeros((self.num_layers, 2))
        if has_bos:
            special[:, 0] = row[:, 0]
        if has_eos:
            special[:, 1] = row[:, -1]
        self._add("special", special, np.array([bool(has_bos), has_eos]))

        if C:
            starts = np.arange(0, C, self.basket_size)
            baskets = np.add.reduceat(content, starts, axis=1)
            self._add("basket", baskets, np.ones(len(starts), dtype=bool))
            bins = np.minimum(((np.arange(C) + 0.5) * self.n_bins / C).astype(np.int64), self.n_bins - 1)
            self._add_grouped("bin", content, bins, self.n_bins)
        if token_segments is not None:
            seg = np.asarray(token_segments, dtype=np.int64)
            if seg.shape != (n_valid,):
                raise ValueError(f"token_segments must have one entry per valid key ({n_valid}); got shape {seg.shape}")
            n_seg = int(seg.max()) + 1 if (seg >= 0).any() else 0
            if n_seg:
                self._add_grouped("segment", row, seg, n_seg)
                counts = np.bincount(seg[seg >= 0], minlength=n_seg).astype(np.float64)
                if self.segment_tokens.shape[0] < n_seg:
                    self.segment_tokens = np.pad(self.segment_tokens, (0, n_seg - self.segment_tokens.shape[0]))
                self.segment_tokens[:n_seg] += counts
        self.n_docs += 1

    def _add(self, view: str, per_layer: np.ndarray, present: np.ndarray) -> None:
        self.views[view].add(per_layer, per_layer[list(self.layers)].mean(0), present)

    def _add_grouped(self, view: str, values: np.ndarray, group: np.ndarray, n: int) -> None:
        keep = group >= 0
        onehot = np.zeros((values.shape[1], n))
        onehot[np.nonzero(keep)[0], group[keep]] = 1.0
        self._add(view, values @ onehot, onehot.sum(0) > 0)

    def merge(self, other: AttentionProfile) -> AttentionProfile:
        """Add another profile's sums (same model, layers, basket size and bins)."""
        for name in ("num_layers", "layers", "basket_size", "n_bins", "pooling", "queries"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(
                    f"cannot merge attention profiles with different {name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
                )
        for v in VIEWS:
            self.views[v].merge(other.views[v])
        if self.segment_tokens.shape[0] < other.segment_tokens.shape[0]:
            self.segment_tokens = np.pad(self.segment_tokens, (0, other.segment_tokens.shape[0] - self.segment_tokens.shape[0]))
        self.segment_tokens[: other.segment_tokens.shape[0]] += other.segment_tokens
        self.n_docs += other.n_docs
        if self.n_calibrated is not None or other.n_calibrated is not None:
            self.n_calibrated = (self.n_calibrated or 0) + (other.n_calibrated or 0)
        self.max_total_error = max(self.max_total_error, other.max_total_error)
        self.max_padding_mass = max(self.max_padding_mass, other.max_padding_mass)
        return self

    # -- results ------------------------------------------------------------------------------
    def stats(self, view: str, layer: int | None = None) -> dict[str, np.ndarray]:
        """Per-cell statistics of ``view`` for the layer set (``layer=None``) or one layer."""
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}; got {view!r}")
        return self.views[view].stats(layer)

    def mean(self, view: str, layer: int | None = None) -> np.ndarray:
        return self.stats(view, layer)["mean"]

    def heatmap(self, view: str = "basket") -> np.ndarray:
        """(num_layers, cells) mean mass per layer."""
        return np.stack([self.mean(view, l) for l in range(self.num_layers)]) if self.views[view].width else np.zeros((self.num_layers, 0))

    def cell_names(self, view: str) -> list[str]:
        n = self.views[view].width
        if view == "special":
            return list(SPECIAL_NAMES)
        if view == "basket":
            B = self.basket_size
            return [f"basket {k + 1} (content keys {k * B + 1}-{(k + 1) * B})" for k in range(n)]
        if view == "bin":
            return [f"{100 * k / n:.0f}-{100 * (k + 1) / n:.0f}%" for k in range(n)]
        return [f"segment {k + 1}" for k in range(n)]

    def meta(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "layers": list(self.layers),
            "basket_size": self.basket_size,
            "n_bins": self.n_bins,
            "pooling": self.pooling,
            "queries": self.queries,
            "query_label": self.query_label,
            "label": self.label,
            "group": self.group,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "calibration": self.calibration,
            "n_calibrated": self.n_calibrated,
            "n_docs": self.n_docs,
            "max_total_error": self.max_total_error,
            "max_padding_mass": self.max_padding_mass,
        }

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (view, cell, layer); ``layer = -1`` is the layer-set average."""
        frames = []
        for view in VIEWS:
            run = self.views[view]
            if not run.width:
                continue
            names = self.cell_names(view)
            for layer in [None, *range(self.num_layers)]:
                st = self.stats(view, layer)
                df = pd.DataFrame(
                    {"cell": np.arange(run.width), "name": names, **{k: st[k] for k in ("mean", "std", "sem", "lo", "hi", "count")}}
                )
                df.insert(0, "layer", -1 if layer is None else layer)
                df.insert(0, "view", view)
                frames.append(df)
        out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        for col, val in (
            ("group", self.group),
            ("label", self.label),
            ("model", self.model),
            ("queries", self.query_label),
            ("basket_size", self.basket_size),
        ):
            out.insert(0, col, val)
        return out

    @property
    def calibrated_share(self) -> float:
        """Fraction of the documents the calibration changed (NaN for a stock profile or no documents)."""
        if self.n_calibrated is None or not self.n_docs:
            return float("nan")
        return self.n_calibrated / self.n_docs

    @property
    def noop(self) -> bool:
        """A calibrated profile in which no document was calibrated: it is the stock profile."""
        return self.n_calibrated == 0 and self.n_docs > 0

    def summary(self) -> dict[str, float]:
        """Headline numbers of the layer-set profile (``calibrated_share`` NaN for stock)."""
        sp, bk = self.mean("special"), self.mean("basket")
        out = {"documents": float(self.n_docs), "calibrated_share": self.calibrated_share, "BOS": float(sp[0]), "EOS": float(sp[1])}
        if bk.size:
            out["first basket"] = float(bk[0])
            out["last basket"] = float(bk[-1])
            out["baskets"] = float(bk.size)
        bins = self.mean("bin")
        if np.isfinite(bins).any():
            half = self.n_bins // 2
            out["first half / second half (bins)"] = float(np.nansum(bins[:half]) / max(np.nansum(bins[half:]), 1e-12))
        return out

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> dict[str, Path]:
        """Write ``<path>.parquet`` (the long table) and ``<path>.npz`` (running sums; :meth:`load`)."""
        stem = Path(path)
        if stem.suffix in (".parquet", ".npz"):
            stem = stem.with_suffix("")
        arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(self.meta(), sort_keys=True)), "segment_tokens": self.segment_tokens}
        for v in VIEWS:
            run = self.views[v]
            for name in ("sum", "sumsq", "set_sum", "set_sumsq", "count"):
                arrays[f"{v}.{name}"] = getattr(run, name)

        def write_npz(p: Path) -> None:
            with open(p, "wb") as fh:
                np.savez(fh, **arrays)

        pq = atomic_write_parquet(stem.with_name(stem.name + ".parquet"), self.to_frame())
        npz = atomic_write(stem.with_name(stem.name + ".npz"), write_npz)
        return {"parquet": pq, "npz": npz}

    @classmethod
    def load(cls, path: str | os.PathLike) -> AttentionProfile:
        p = Path(path)
        if p.suffix != ".npz":
            p = p.with_name(p.name + ".npz") if p.suffix != ".parquet" else p.with_suffix(".npz")
        with np.load(p, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            views = {}
            for v in VIEWS:
                views[v] = _Running(
                    meta["num_layers"], *(np.array(data[f"{v}.{n}"]) for n in ("sum", "sumsq", "set_sum", "set_sumsq", "count"))
                )
            seg_tokens = np.array(data["segment_tokens"])
        for k in ("query_label",):
            meta.pop(k)
        meta["layers"] = tuple(meta["layers"])
        return cls(**meta, views=views, segment_tokens=seg_tokens)


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
            raise ValueError(f"document {i} is empty")
    if segments is not None:
        if len(segments) != len(texts):
            raise ValueError(f"segments has {len(segments)} entries for {len(texts)} documents")
        spans = [None if s is None else tuple((int(a), int(b)) for a, b in s) for s in segments]
    return texts, spans


def attention_profile(
    model,
    documents: Sequence[Any],
    *,
    segments: Sequence[Sequence[tuple[int, int]]] | None = None,
    layers: LayerSpec = None,
    basket_size: int = 128,
    n_bins: int = 20,
    calibration=None,
    batch_size: int = 8,
    queries: str | None = None,
    label: str | None = None,
    group: str = "",
    model_name: str = "",
    progress: Callable[[int], None] | None = None,
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
        calibration: a :class:`posfair.Calibration` (None = the stock model).
        queries: "pool" (the pooling token's row) or "all" (mean over valid query
            rows); default "all" for mean-pooled models, else "pool".
        progress: called with the number of documents done after each batch.

    Raises ValueError for layers outside the model, ``basket_size < 1`` and documents
    longer than the model's ``max_seq_length`` (they would be truncated).
    """
    import torch

    if isinstance(basket_size, bool) or not isinstance(basket_size, (int, np.integer)) or basket_size < 1:
        raise ValueError(f"basket_size must be an integer >= 1; got {basket_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    num_layers = model.num_layers
    chosen = resolve_layers(layers, num_layers)
    pooling = model.pooling or "cls"
    queries = queries or ("all" if pooling == "mean" else "pool")
    if queries not in ("pool", "all"):
        raise ValueError(f"queries must be 'pool' or 'all'; got {queries!r}")
    texts, spans = _doc_inputs(documents, segments)
    tok = model.tokenizer
    limit = model.max_seq_length or model.position_limit
    lengths = model.token_lengths(texts) if texts else np.zeros(0, dtype=np.int64)
    over = np.nonzero(lengths > limit)[0] if limit else np.zeros(0, dtype=np.int64)
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"{over.size} document(s) are longer than the model's limit of {limit} tokens (first: document {i}, "
            f"{int(lengths[i])} tokens); they would be truncated. Use shorter documents or raise max_seq_length "
            f"(position limit {model.position_limit})"
        )
    cal_dict = calibration.to_dict() if calibration is not None else None
    n_calibrated = None
    if calibration is not None:
        import warnings

        from posfair.calibration.coverage import CalibrationFallbackWarning, calibration_coverage

        coverage = calibration_coverage(model.transformer_module.resolve(calibration), lengths)  # no truncation: lengths are the spans
        n_calibrated = coverage.calibrated
        if coverage.message():
            warnings.warn(
                f"attention profile {label or calibration.label()}: {coverage.message()}", CalibrationFallbackWarning, stacklevel=2
            )
    if label is None:
        label = calibration.label() if calibration is not None else "stock"
    profile = AttentionProfile(
        num_layers=num_layers, layers=chosen, basket_size=int(basket_size), n_bins=n_bins, pooling=pooling, queries=queries,
        label=label, group=group, model=model_name, fingerprint=model.fingerprint, calibration=cal_dict, n_calibrated=n_calibrated,
    )  # fmt: skip
    from posfair.fairness.documents import token_segment_index

    device = next(model.parameters()).device
    buffer: dict[int, np.ndarray] = {}

    def recorder(layer: int, rows) -> None:
        buffer[layer] = rows.float().mean(1).double().cpu().numpy()  # (B, K)

    every = list(range(num_layers))
    with torch.no_grad(), model.using(calibration), model.recording_attention(recorder, every, queries=queries):
        for b0 in range(0, len(texts), batch_size):
            batch = texts[b0 : b0 + batch_size]
            enc = tok(
                batch, padding=True, truncation=False, return_tensors="pt", return_offsets_mapping=True, return_special_tokens_mask=True
            )
            features = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            features["modality"] = "text"
            buffer.clear()
            model(features)
            missing = [l for l in every if l not in buffer]
            if missing:
                raise RuntimeError(f"the attention recorder saw no rows for layers {missing}")
            rows = np.stack([buffer[l] for l in every])  # (L, B, K)
            mask = enc["attention_mask"].numpy().astype(bool)
            special = enc["special_tokens_mask"].numpy().astype(bool)
            offsets = enc["offset_mapping"].numpy()
            for j in range(len(batch)):
                valid = np.nonzero(mask[j])[0]
                s, e = int(valid[0]), int(valid[-1])
                pad = rows[:, j, ~mask[j]]
                if pad.size:
                    profile.max_padding_mass = max(profile.max_padding_mass, float(np.abs(pad).max()))
                seg = None
                if spans[b0 + j] is not None:
                    seg = token_segment_index(offsets[j, s : e + 1], spans[b0 + j], special[j, s : e + 1])
                profile.add_document(
                    rows[:, j, s : e + 1], has_bos=bool(special[j, s]), has_eos=bool(special[j, e]) and e > s, token_segments=seg
                )
            if progress is not None:
                progress(len(batch))
    return profile
