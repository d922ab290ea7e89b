"""The Pareto front of a search's trials: the settings no other beats on both the score and the guard."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posfair.tuning.space import Trial

__all__ = ["pareto_front"]


def pareto_front(trials: Sequence[Trial], score: str, guard: str, greater_is_better: bool) -> list[Trial]:
    """The trials no other trial beats on both the score and the guard (higher guard is better)."""

    def better_or_equal(a: Trial, b: Trial) -> bool:
        sa, sb = a.metrics[score], b.metrics[score]
        return (sa >= sb if greater_is_better else sa <= sb) and a.metrics[guard] >= b.metrics[guard]

    def strictly(a: Trial, b: Trial) -> bool:
        return better_or_equal(a, b) and (a.metrics[score] != b.metrics[score] or a.metrics[guard] != b.metrics[guard])

    ok = [t for t in trials if np.isfinite(t.metrics.get(score, np.nan)) and np.isfinite(t.metrics.get(guard, np.nan))]
    front = [t for t in ok if not any(strictly(o, t) for o in ok if o is not t)]
    return sorted(front, key=lambda t: (t.metrics[guard], t.strength), reverse=True)
