"""The attention profile: a streaming record of pooling-token attention over many documents.

:class:`AttentionProfile` adds documents one at a time (:meth:`~AttentionProfile.add_document`),
merges with other profiles of the same model and settings, reports per-cell
statistics, and saves / loads its running sums.  How the rows are obtained from a
model is :func:`posfair.attention.profile.attention_profile`; how one row becomes
view cells is :mod:`posfair.attention.views`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.attention.views import SPECIAL_NAMES, VIEWS, RunningSums, cell_names, document_views
from posfair.files.atomic import atomic_write, atomic_write_parquet
from posfair.runtime.errors import PosfairInputError

__all__ = ["AttentionProfile", "query_label"]


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
class AttentionProfile:
    """Streaming accumulator of pooling-token attention mass (see :mod:`posfair.attention.profile`).

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
    #: the model's token limit the documents were encoded under (0: not recorded)
    token_limit: int = 0
    calibration: dict | None = None
    n_calibrated: int | None = None  # documents the calibration changed (None: stock profile)
    n_docs: int = 0
    max_total_error: float = 0.0  # max |sum of a document's row over its valid keys - 1|
    max_padding_mass: float = 0.0  # max mass any padding key received
    views: dict[str, RunningSums] = field(default_factory=dict)
    segment_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if (
            isinstance(self.basket_size, bool)
            or not isinstance(self.basket_size, (int, np.integer))
            or self.basket_size < 1
        ):
            raise PosfairInputError(f"basket_size must be an integer >= 1; got {self.basket_size!r}")
        if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, (int, np.integer)) or self.n_bins < 1:
            raise PosfairInputError(f"n_bins must be an integer >= 1; got {self.n_bins!r}")
        bad = [layer for layer in self.layers if not 0 <= layer < self.num_layers]
        if bad or not self.layers:
            raise PosfairInputError(
                f"layers {list(self.layers)} invalid: the model has {self.num_layers} layers (0..{self.num_layers - 1})"
            )
        self.layers = tuple(int(layer) for layer in self.layers)
        for v in VIEWS:
            self.views.setdefault(v, RunningSums(self.num_layers))
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
        cells = document_views(
            row,
            has_bos=has_bos,
            has_eos=has_eos,
            basket_size=self.basket_size,
            n_bins=self.n_bins,
            token_segments=token_segments,
        )
        self.max_total_error = max(self.max_total_error, float(np.abs(row[sel].sum(1) - 1.0).max()))
        for view, per_layer, present in cells:
            self.views[view].add(per_layer, per_layer[sel].mean(0), present)
            if view == "segment":
                seg = np.asarray(token_segments, dtype=np.int64)
                n_seg = per_layer.shape[1]
                counts = np.bincount(seg[seg >= 0], minlength=n_seg).astype(np.float64)
                if self.segment_tokens.shape[0] < n_seg:
                    self.segment_tokens = np.pad(self.segment_tokens, (0, n_seg - self.segment_tokens.shape[0]))
                self.segment_tokens[:n_seg] += counts
        self.n_docs += 1

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
            self.segment_tokens = np.pad(
                self.segment_tokens, (0, other.segment_tokens.shape[0] - self.segment_tokens.shape[0])
            )
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
            raise PosfairInputError(f"view must be one of {VIEWS}; got {view!r}")
        return self.views[view].stats(layer)

    def mean(self, view: str, layer: int | None = None) -> np.ndarray:
        return self.stats(view, layer)["mean"]

    def heatmap(self, view: str = "basket") -> np.ndarray:
        """(num_layers, cells) mean mass per layer."""
        if not self.views[view].width:
            return np.zeros((self.num_layers, 0))
        return np.stack([self.mean(view, layer) for layer in range(self.num_layers)])

    def cell_names(self, view: str) -> list[str]:
        return cell_names(view, self.views[view].width, self.basket_size)

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
            "token_limit": self.token_limit,
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
                    {
                        "cell": np.arange(run.width),
                        "name": names,
                        **{k: st[k] for k in ("mean", "std", "sem", "lo", "hi", "count")},
                    }
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
        out = {
            "documents": float(self.n_docs),
            "calibrated_share": self.calibrated_share,
            "BOS": float(sp[0]),
            "EOS": float(sp[1]),
        }
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
        arrays: dict[str, np.ndarray] = {
            "meta": np.array(json.dumps(self.meta(), sort_keys=True)),
            "segment_tokens": self.segment_tokens,
        }
        for v in VIEWS:
            run = self.views[v]
            for name in RunningSums.ARRAYS:
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
            views = {
                v: RunningSums(meta["num_layers"], *(np.array(data[f"{v}.{n}"]) for n in RunningSums.ARRAYS))
                for v in VIEWS
            }
            seg_tokens = np.array(data["segment_tokens"])
        meta.pop("query_label")
        meta["layers"] = tuple(meta["layers"])
        return cls(**meta, views=views, segment_tokens=seg_tokens)
