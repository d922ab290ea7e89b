"""Paired bootstrap intervals: the one resampling rule behind every interval posfair puts on a comparison.

A comparison of two settings (a calibration and stock) on the same units (segment sets, queries)
is resampled *paired*: one draw picks units with replacement and both settings are measured on
the same picks, so what the units share cancels.  Draws come from
``numpy.random.default_rng(seed)``; the interval is the percentile interval of the statistic
over the draws.  Numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "BOOTSTRAP_DRAWS",
    "BOOTSTRAP_SEED",
    "bootstrap_indices",
    "paired_mean_interval",
    "grouped_interval",
    "interval_verdict",
    "units_to_resolve",
]

#: draws and seed of every paired bootstrap (recorded beside each interval)
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 2000, 0


def bootstrap_indices(n: int, draws: int = BOOTSTRAP_DRAWS, rng: np.random.Generator | None = None) -> np.ndarray:
    """(draws, n) indices into ``n`` units, drawn with replacement."""
    rng = rng if rng is not None else np.random.default_rng(BOOTSTRAP_SEED)
    return rng.integers(0, n, size=(draws, n))


def paired_mean_interval(
    differences: Sequence[float], level: float = 0.95, draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile interval of the mean of per-unit paired differences (``b_i - a_i``)."""
    d = np.asarray(differences, dtype=np.float64)
    means = d[bootstrap_indices(len(d), draws, np.random.default_rng(seed))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def grouped_interval(
    groups: Sequence[np.ndarray],
    statistic: Callable[[list[np.ndarray]], float],
    level: float = 0.95,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile interval of ``statistic`` when each group's units are resampled within the group.

    ``groups``: per group (e.g. per audit instance) an array whose first axis is the units (segment
    sets), each row holding everything measured on that unit under both settings (paired).
    ``statistic(list of resampled arrays)`` returns one number."""
    rng = np.random.default_rng(seed)
    picks = [bootstrap_indices(len(g), draws, rng) for g in groups]
    values = np.array([statistic([g[p[b]] for g, p in zip(groups, picks, strict=True)]) for b in range(draws)])
    values = values[np.isfinite(values)]
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


#: z for a two-sided 95 % normal interval, in the number of units a constraint needs (:func:`units_to_resolve`)
_Z95 = 1.959963984540054


def units_to_resolve(sd: float, max_drop: float) -> int | None:
    """How many units a paired comparison needs before its 95 % interval is no wider than ``±max_drop``
    (normal approximation, ``n = (1.96 sd / max_drop)^2``, ``sd`` = the paired differences' standard deviation);
    None when ``max_drop`` is 0 (no finite sample resolves it)."""
    if max_drop <= 0:
        return None
    return max(2, math.ceil((_Z95 * sd / max_drop) ** 2))


def interval_verdict(low: float, high: float, limit: float) -> str:
    """An interval judged against a limit (a guard's constraint): ``holds`` (the whole interval above ``limit``), ``broken``
    (the whole interval below), else ``unresolved`` (the data cannot tell)."""
    if low >= limit - 1e-12:
        return "holds"
    if high < limit:
        return "broken"
    return "unresolved"
