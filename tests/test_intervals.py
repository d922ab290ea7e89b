"""The paired bootstrap behind every interval on a comparison, against explicit loops and hand arithmetic."""

import numpy as np
import pytest

from posfair.stats.intervals import grouped_interval, paired_mean_interval
from posfair.tuning.objectives import FairnessObjective


def test_paired_mean_interval_is_the_percentile_interval_of_resampled_means():
    d = np.array([0.1, -0.3, 0.25, 0.0, 0.4, -0.05, 0.2])
    rng = np.random.default_rng(5)
    means = []
    for _ in range(300):  # one draw at a time: n picks with replacement
        picks = rng.integers(0, len(d), size=len(d))
        means.append(d[picks].mean())
    assert paired_mean_interval(d, draws=300, seed=5) == pytest.approx(
        (np.quantile(means, 0.025), np.quantile(means, 0.975)), abs=1e-12
    )
    # no spread among the units: the interval is the point
    assert paired_mean_interval(np.full(6, 0.02)) == pytest.approx((0.02, 0.02))


def test_grouped_interval_resamples_within_each_group():
    a, b = np.arange(5.0), np.arange(3.0) * 10
    stat = lambda gs: gs[0].mean() - gs[1].mean()  # noqa: E731
    rng = np.random.default_rng(1)
    pa, pb = rng.integers(0, 5, size=(50, 5)), rng.integers(0, 3, size=(50, 3))  # group by group, as documented
    values = [a[pa[k]].mean() - b[pb[k]].mean() for k in range(50)]
    assert grouped_interval([a, b], stat, draws=50, seed=1) == pytest.approx(
        (np.quantile(values, 0.025), np.quantile(values, 0.975)), abs=1e-12
    )


def test_spread_removed_by_hand():
    # instance 1 (n=2): stock position means .6/.5 (spread .10), calibrated .55/.53 (.02)
    # instance 2 (n=3): stock .7/.6/.5 (.20), calibrated .60/.62/.57 (.05)
    g1 = np.array([[[0.6, 0.5], [0.55, 0.53]], [[0.6, 0.5], [0.55, 0.53]]])  # (sets, stock|calibrated, positions)
    g2 = np.array([[[0.8, 0.6, 0.4], [0.60, 0.64, 0.57]], [[0.6, 0.6, 0.6], [0.60, 0.60, 0.57]]])
    removed = FairnessObjective.score_effect(None, [g1, g2])
    assert removed == pytest.approx(1 - (0.02 + 0.05) / 2 / ((0.10 + 0.20) / 2))
