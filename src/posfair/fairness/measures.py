"""Per-(document, position) measures: representation sigma, retention tau, and the fidelity measures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from posfair.encoding import l2_normalize
from posfair.model.token_spans import contextualised_segments

__all__ = [
    "Direction",
    "rowwise_cosine",
    "contextualised_segments",
    "fidelity_measures",
    "profile_spread",
    "profile_slope",
    "reversal_text",
    "sets_slope",
    "slope_direction",
]


def _unit64(x: np.ndarray) -> np.ndarray:
    """``x`` in float64 with the last axis L2-normalised (the measures are computed in float64)."""
    return l2_normalize(np.asarray(x, dtype=np.float64))


def rowwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``cos(a[i], b[i])`` for every row (broadcasting over leading axes)."""
    return np.sum(_unit64(a) * _unit64(b), axis=-1)


def fidelity_measures(
    docs: np.ndarray,
    pool: np.ndarray,
    own: np.ndarray,
    own_set: Sequence[np.ndarray],
    stock_docs: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """What calibration costs, per document: ``other_cos``, ``recall`` and ``drift`` (each shape (m,)).

    Args:
        docs: (m, dim) document embeddings.
        pool: (P, dim) standalone segment embeddings of the instance (every segment of every set).
        own: (m, n) pool rows of each document's own segments (position order).
        own_set: per document, the pool rows of every segment of its segment set (in mixed
            language configurations this includes the other-language versions of its topics).
        stock_docs: (m, dim) stock embeddings of the same documents; None = these are the stock ones.

    ``other_cos``: mean cosine of the document to the standalone segments of the *other*
    segment sets (the pool minus ``own_set``; NaN if there are none); the margin of a
    position is ``sigma - other_cos``.  ``recall``: own-segment recall@n - among the
    candidates (the document's n segments and every segment of the other sets), the
    share of its own segments among the n most similar (ties broken by pool order).
    ``drift``: ``cos(docs, stock_docs)``, exactly 1 when ``stock_docs`` is None.
    """
    docs = np.asarray(docs)
    own = np.asarray(own, dtype=np.int64)
    m, n = own.shape
    if len(docs) != m or len(own_set) != m:
        raise ValueError(f"{len(docs)} documents but {m} rows of own segments and {len(own_set)} own sets")
    cos = _unit64(docs) @ _unit64(pool).T  # (m, P)
    in_set = np.zeros(cos.shape, dtype=bool)
    for i, rows in enumerate(own_set):
        in_set[i, np.asarray(rows, dtype=np.int64)] = True
    is_own = np.zeros(cos.shape, dtype=bool)
    np.put_along_axis(is_own, own, True, axis=1)
    if (is_own & ~in_set).any():
        raise ValueError("a document's own segments must belong to its own set")
    other = ~in_set
    n_other = other.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        other_cos = np.where(n_other > 0, np.where(other, cos, 0.0).sum(axis=1) / n_other, np.nan)
    scores = np.where(is_own | other, cos, -np.inf)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :n]
    recall = np.take_along_axis(is_own, top, axis=1).sum(axis=1) / n
    drift = np.ones(m) if stock_docs is None else rowwise_cosine(docs, stock_docs)
    return {"other_cos": other_cos, "recall": recall.astype(np.float64), "drift": drift}


def profile_spread(values: np.ndarray, positions: np.ndarray) -> float:
    """Max minus min over positions of the mean of ``values`` at each position (the profile's spread)."""
    means = [float(np.mean(np.asarray(values)[np.asarray(positions) == p])) for p in np.unique(positions)]
    return max(means) - min(means)


def profile_slope(values: np.ndarray, positions: np.ndarray) -> float:
    """The direction of the profile: least-squares slope of the per-position means of ``values`` on the position
    (change per position step).  Negative: earlier positions represented better (the papers' finding); positive:
    later ones.  The spread says how uneven the profile is, the slope which way it leans."""
    pos = np.unique(positions)
    means = np.array([float(np.mean(np.asarray(values)[np.asarray(positions) == p])) for p in pos])
    x = pos.astype(np.float64) - pos.mean()
    return float(x @ (means - means.mean()) / (x @ x)) if len(pos) > 1 else float("nan")


def reversal_text(stock_slope: float, slope: float, what: str = "the calibration") -> str | None:
    """A sentence when ``slope`` leans the other way than ``stock_slope`` (a reversed profile), else None.

    A reversal is bias in the other direction: the spread it leaves is not "removed" bias, and a spread
    smaller than stock's does not make it fair."""
    if (
        not (np.isfinite(stock_slope) and np.isfinite(slope))
        or stock_slope == 0
        or np.sign(slope) != -np.sign(stock_slope)
    ):
        return None
    lean = "later" if slope > 0 else "earlier"
    return (
        f"{what} reverses the σ profile (slope {slope:+.4f} per position, stock {stock_slope:+.4f}): {lean} "
        "positions are now represented better; its spread is bias in the other direction, not bias removed"
    )


def sets_slope(groups: Sequence[np.ndarray], column: int) -> float:
    """The σ slope from per-set position means: per instance an array (sets, 2, n) of each segment set's mean σ
    at positions 1..n under stock (``column`` 0) and a calibration (1) -- the fairness objective's units; the
    least-squares slope of the instance's position means (the mean over its sets), averaged over instances.
    With every ordering of each set in the documents (each set weighs the same at every position) this is
    :func:`profile_slope` of the documents' σ, averaged over instances: the tuner's ``slope`` metric."""
    slopes = []
    for g in groups:
        means = np.asarray(g, dtype=np.float64)[:, column].mean(axis=0)
        slopes.append(profile_slope(means, np.arange(1, len(means) + 1)))
    return float(np.mean(slopes))


#: the direction of a calibrated profile, judged on the 95 % interval of its slope (:func:`slope_direction`)
DIRECTIONS = ("as stock", "unresolved", "reversed")


#: which way a calibrated σ profile leans against stock's, judged on its slope's interval (:func:`slope_direction`)
Direction = Literal["as stock", "unresolved", "reversed"]


def slope_direction(stock_slope: float, low: float, high: float) -> Direction:
    """Which way a calibrated σ profile leans, judged on its slope's interval ``[low, high]`` against the sign
    of stock's slope: ``"reversed"`` when the whole interval lies on the other side of zero (bias the other
    way, beyond noise), ``"as stock"`` when it lies on stock's side, ``"unresolved"`` when it includes zero
    (the data cannot tell which way the profile leans: a flat profile, or too few units).  A sign flip inside
    the interval is :func:`reversal_text`'s reversal but not this one's.  Without a stock direction (stock's
    slope 0 or not finite) nothing is reversed: ``"unresolved"`` when the interval includes zero, else ``"as
    stock"``."""
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0 <= high:
        return "unresolved"
    if not np.isfinite(stock_slope) or stock_slope == 0:
        return "as stock"
    return "as stock" if (low > 0) == (stock_slope > 0) else "reversed"
