"""The views of one document's attention row, and the running sums they are aggregated in.

A document's row (``num_layers`` x valid keys, head-averaged post-softmax mass of
the pooling query) is summarised in four views (see :mod:`posfair.attention.profile`):
``special`` (BOS and EOS keys), ``basket`` (consecutive baskets of content keys),
``bin`` (relative-position bins of the content keys) and ``segment`` (the mass
on each segment, when token-to-segment indices are given).  :func:`document_views`
computes them; :class:`RunningSums` keeps, per view cell, the sums and sums of
squares per layer and for the chosen layer set plus the number of documents that
have the cell, so means and standard errors are exact however the documents are
batched or merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["VIEWS", "SPECIAL_NAMES", "Z95", "ViewCells", "RunningSums", "document_views", "cell_names"]

VIEWS = ("special", "basket", "bin", "segment")
SPECIAL_NAMES = ("BOS", "EOS")
Z95 = 1.959963984540054


class ViewCells(NamedTuple):
    """One document's cells of one view: ``per_layer`` (L, cells) mass and ``present`` (cells,) bool."""

    view: str
    per_layer: np.ndarray
    present: np.ndarray


def _grouped(view: str, values: np.ndarray, group: np.ndarray, n: int) -> ViewCells:
    """Sum the keys (columns of ``values``) of each group ``0..n-1``; keys of group -1 are left out."""
    keep = group >= 0
    onehot = np.zeros((values.shape[1], n))
    onehot[np.nonzero(keep)[0], group[keep]] = 1.0
    return ViewCells(view, values @ onehot, onehot.sum(0) > 0)


def document_views(
    row: np.ndarray,
    *,
    has_bos: bool,
    has_eos: bool,
    basket_size: int,
    n_bins: int,
    token_segments: np.ndarray | None = None,
) -> list[ViewCells]:
    """The cells of every view of one document.

    ``row`` (L, n_valid): mass per layer over the valid keys (padding removed).  The BOS key
    (first, when ``has_bos``) and the EOS key (last, when ``has_eos`` and it is not the BOS key)
    are the ``special`` view; the keys between them are the content.  Content key ``i`` of ``C``
    falls into bin ``floor((i + 0.5) / C * n_bins)``.  ``token_segments`` (n_valid,): segment
    index per key or -1 (the ``segment`` view covers every valid key).
    """
    n_valid = row.shape[1]
    has_eos = bool(has_eos) and n_valid > int(bool(has_bos))
    c0, c1 = int(bool(has_bos)), n_valid - int(has_eos)
    content = row[:, c0:c1]
    C = content.shape[1]
    special = np.zeros((row.shape[0], 2))
    if has_bos:
        special[:, 0] = row[:, 0]
    if has_eos:
        special[:, 1] = row[:, -1]
    out = [ViewCells("special", special, np.array([bool(has_bos), has_eos]))]
    if C:
        starts = np.arange(0, C, basket_size)
        out.append(ViewCells("basket", np.add.reduceat(content, starts, axis=1), np.ones(len(starts), dtype=bool)))
        bins = np.minimum(((np.arange(C) + 0.5) * n_bins / C).astype(np.int64), n_bins - 1)
        out.append(_grouped("bin", content, bins, n_bins))
    if token_segments is not None:
        seg = np.asarray(token_segments, dtype=np.int64)
        if seg.shape != (n_valid,):
            raise ValueError(f"token_segments must have one entry per valid key ({n_valid}); got shape {seg.shape}")
        n_seg = int(seg.max()) + 1 if (seg >= 0).any() else 0
        if n_seg:
            out.append(_grouped("segment", row, seg, n_seg))
    return out


def cell_names(view: str, width: int, basket_size: int) -> list[str]:
    """Readable names of the first ``width`` cells of ``view``."""
    if view == "special":
        return list(SPECIAL_NAMES)
    if view == "basket":
        B = basket_size
        return [f"basket {k + 1} (content keys {k * B + 1}-{(k + 1) * B})" for k in range(width)]
    if view == "bin":
        return [f"{100 * k / width:.0f}-{100 * (k + 1) / width:.0f}%" for k in range(width)]
    return [f"segment {k + 1}" for k in range(width)]


@dataclass
class RunningSums:
    """Running sums for one view: per layer (L, n) and for the layer set (n,), and the count per cell."""

    n_layers: int
    sum: np.ndarray = None  # type: ignore[assignment]
    sumsq: np.ndarray = None  # type: ignore[assignment]
    set_sum: np.ndarray = None  # type: ignore[assignment]
    set_sumsq: np.ndarray = None  # type: ignore[assignment]
    count: np.ndarray = None  # type: ignore[assignment]

    #: the arrays, in the order :meth:`posfair.attention.profile.AttentionProfile.save` stores them
    ARRAYS = ("sum", "sumsq", "set_sum", "set_sumsq", "count")

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

    def merge(self, other: RunningSums) -> None:
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
