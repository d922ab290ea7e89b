"""Positional groups, length buckets and relative-position bins, as published.

Conventions (each reproduces the public reference code; see
``docs/definitions.md``, section 4):

* **SQuAD-PosQ** groups the queries by the character offset of the first answer
  (``answers.answer_start[0]``) into ``[0-100], [100-200], [200-300], [300-400],
  [400-500], [500-3120]``.  The reference code selects a group with
  ``lo <= answer_start <= hi``, i.e. **inclusive bounds on both ends**, so a
  start of exactly 100, 200, 300, 400 or 500 counts in two adjacent groups.
  That is our default (``convention="inclusive"``); ``convention="half-open"``
  gives ``[lo, hi)`` groups (the last one closed) in which every query is in
  exactly one group.  Starts outside ``[0, 3120]`` are in no group.
* **FineWeb-PosQ** groups by ``span_class`` (a list of ``"beginning"``,
  ``"middle"``, ``"end"``); a question tagged with two parts counts in both.
* **PosIR** length buckets on ``pos_token_length`` are right-closed:
  Q1 = (0, 512], Q2 = (512, 1024], Q3 = (1024, 1536], Q4 = (1536, inf); a
  length of 0 (or missing) is in no bucket.  The relative position of a query is
  the midpoint of ``pos_char_span`` divided by ``pos_char_length``; queries with
  ``pos_char_length <= 0`` or a negative midpoint have none; the midpoint is
  capped at the length and the ratio clipped to [0, 1].  The 20 bins are those
  of ``pandas.cut(relpos, numpy.linspace(0, 1, 21), include_lowest=True)``:
  bin 0 = [0, 0.05], bin i = (0.05 i, 0.05 (i + 1)].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "SQUAD_BOUNDS",
    "SQUAD_LABELS",
    "FINEWEB_CLASSES",
    "FINEWEB_LABELS",
    "POSIR_BUCKETS",
    "N_RELPOS_BINS",
    "squad_group_masks",
    "fineweb_group_masks",
    "posir_length_bucket",
    "posir_relative_position",
    "relpos_bin",
]

SQUAD_BOUNDS: tuple[tuple[int, int], ...] = ((0, 100), (100, 200), (200, 300), (300, 400), (400, 500), (500, 3120))
SQUAD_LABELS: tuple[str, ...] = ("0+", "100+", "200+", "300+", "400+", "500+")
FINEWEB_CLASSES: tuple[str, ...] = ("beginning", "middle", "end")
FINEWEB_LABELS: tuple[str, ...] = ("begin", "middle", "end")
POSIR_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("Q1", 0.0, 512.0),
    ("Q2", 512.0, 1024.0),
    ("Q3", 1024.0, 1536.0),
    ("Q4", 1536.0, float("inf")),
)
N_RELPOS_BINS = 20
_RELPOS_EDGES = np.linspace(0.0, 1.0, N_RELPOS_BINS + 1)


def squad_group_masks(answer_starts: Sequence[int], convention: str = "inclusive") -> dict[str, np.ndarray]:
    """Boolean masks (one per SQuAD-PosQ group, in published order) over the queries.

    ``convention="inclusive"`` (default, the reference code): ``lo <= s <= hi``.
    ``convention="half-open"``: ``lo <= s < hi``, last group ``500 <= s <= 3120``.
    """
    if convention not in ("inclusive", "half-open"):
        raise ValueError(f"convention must be 'inclusive' or 'half-open'; got {convention!r}")
    s = np.asarray(answer_starts, dtype=np.int64)
    masks = {}
    for i, ((lo, hi), group) in enumerate(zip(SQUAD_BOUNDS, SQUAD_LABELS, strict=True)):
        last = i == len(SQUAD_BOUNDS) - 1
        if convention == "inclusive" or last:
            masks[group] = (s >= lo) & (s <= hi)
        else:
            masks[group] = (s >= lo) & (s < hi)
    return masks


def fineweb_group_masks(span_classes: Sequence[Iterable[str]]) -> dict[str, np.ndarray]:
    """Boolean masks begin / middle / end over the queries (a query may be in several)."""
    sets = []
    for i, spans in enumerate(span_classes):
        if isinstance(spans, str):
            spans = [spans]
        spans = set(spans if spans is not None else ())
        unknown = spans - set(FINEWEB_CLASSES)
        if unknown:
            raise ValueError(
                f"FineWeb-PosQ row {i}: unknown span_class values {sorted(unknown)}; expected {FINEWEB_CLASSES}"
            )
        sets.append(spans)
    return {
        group: np.array([c in s for s in sets], dtype=bool)
        for c, group in zip(FINEWEB_CLASSES, FINEWEB_LABELS, strict=True)
    }


def posir_length_bucket(token_length: float | None) -> str | None:
    """PosIR length bucket of a document length in tokens (right-closed), or None."""
    if token_length is None or not np.isfinite(token_length):
        return None
    for bucket, lo, hi in POSIR_BUCKETS:
        if lo < token_length <= hi:
            return bucket
    return None


def posir_relative_position(span: Sequence[float] | None, char_length: float | None) -> float:
    """Midpoint of ``span`` / ``char_length`` clipped to [0, 1]; NaN when undefined."""
    if span is None or char_length is None or len(span) != 2:
        return float("nan")
    length = float(char_length)
    mid = (float(span[0]) + float(span[1])) / 2.0
    if not length > 0 or mid < 0:
        return float("nan")
    return float(np.clip(min(mid, length) / length, 0.0, 1.0))


def relpos_bin(relpos: np.ndarray | Sequence[float]) -> np.ndarray:
    """Bin index 0..19 of each relative position (-1 for NaN), ``pandas.cut`` semantics."""
    r = np.asarray(relpos, dtype=float)
    out = np.full(r.shape, -1, dtype=np.int64)
    ok = np.isfinite(r) & (r >= 0) & (r <= 1)
    idx = np.searchsorted(_RELPOS_EDGES, r[ok], side="left") - 1
    out[ok] = np.clip(idx, 0, N_RELPOS_BINS - 1)
    return out
