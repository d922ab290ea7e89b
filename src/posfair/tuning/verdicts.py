"""What the held-out test split says about the chosen setting, with intervals, and the sentences that say it.

Pure: every verdict is computed from the objective, the trials and the chosen setting it is given (never from the
search's :class:`~posfair.tuning.tune_result.TuneResult`, which records them).

The constraint rule (:func:`meets_constraint`, one rule for the dev choice and the test check), the paired bootstrap
intervals of every trial's guard change and score effect (:func:`trial_intervals`; the resampling itself is
:mod:`posfair.stats.intervals`), the σ profile's direction (:func:`slope_interval`), and the verdicts of the test
split: :func:`check_test_constraint` / :func:`constraint_verdict` and :func:`test_score_effect` /
:func:`direction_text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from posfair.calibration import STOCK
from posfair.calibration.choice import Resolved
from posfair.fairness.measures import Direction, slope_direction
from posfair.stats.intervals import (
    BOOTSTRAP_DRAWS,
    BOOTSTRAP_SEED,
    grouped_interval,
    paired_mean_interval,
    units_to_resolve,
)
from posfair.tuning.objectives import TEST, Objective
from posfair.tuning.space import Trial, find_trial

__all__ = [
    "ChosenEffect",
    "ConstraintCheck",
    "GuardChange",
    "ScoreEffect",
    "SlopeInterval",
    "TrialInterval",
    "CHECK_DRAWS",
    "CHECK_SEED",
    "ConstraintWarning",
    "SLOPE_KEYS",
    "check_test_constraint",
    "constraint_verdict",
    "direction_text",
    "guard_change_interval",
    "meets_constraint",
    "score_effect_interval",
    "slope_interval",
    "test_score_effect",
    "trial_intervals",
]


def meets_constraint(guard: float, stock_guard: float, max_drop: float) -> bool:
    """The constraint, one rule for the dev choice and the test check: the guard metric (higher is better)
    at most ``max_drop`` below stock's on the same split."""
    return bool(guard >= stock_guard - max_drop - 1e-12)


class ConstraintWarning(UserWarning):
    """The setting chosen on the dev split breaks the constraint on the held-out test split."""


#: paired bootstrap of the test split's guard change: draws and seed (recorded with the check)
CHECK_DRAWS, CHECK_SEED = BOOTSTRAP_DRAWS, BOOTSTRAP_SEED


@dataclass(frozen=True)
class GuardChange:
    """The guard's change (a calibration minus stock, paired per unit) with its 95 % bootstrap interval."""

    change: float
    low: float
    high: float
    units: int
    sd: float  # the paired differences' standard deviation (how many units a constraint needs)


@dataclass(frozen=True)
class SlopeInterval:
    """A calibrated σ profile's slope on position with its 95 % interval, stock's slope, and the direction."""

    stock_slope: float
    slope: float
    slope_low: float
    slope_high: float
    direction: Direction


@dataclass(frozen=True)
class ScoreEffect:
    """A calibration's effect on the score (:meth:`Objective.score_effect`) with its 95 % bootstrap interval over
    the objective's units, and the profile's slope where the objective has one."""

    effect: float
    low: float
    high: float
    units: int
    slope: SlopeInterval | None = None


@dataclass(frozen=True)
class TrialInterval:
    """One calibrated trial's intervals: the guard's change and the score's effect (None: the objective gives no
    per-unit numbers for it)."""

    guard: GuardChange | None
    effect: ScoreEffect | None

    def to_dict(self) -> dict[str, Any]:
        """The flat row ``tune.json`` and the tables hold (``guard_change``, ``guard_low``, ``effect_low``, ...)."""
        row: dict[str, Any] = {}
        if self.guard is not None:
            g = self.guard
            row.update(guard_change=g.change, guard_low=g.low, guard_high=g.high, units=g.units)
        if self.effect is not None:
            e = self.effect
            row.update(effect=e.effect, effect_low=e.low, effect_high=e.high, units=e.units)
            if e.slope is not None:
                row.update(asdict(e.slope))
        return row


@dataclass(frozen=True)
class ConstraintCheck:
    """Whether the chosen setting keeps the constraint on the held-out test split (:func:`check_test_constraint`):
    the guard on stock and chosen, the change against ``limit`` (``-max_drop``), whether it holds on the point
    estimate, and the change's paired interval (None where the objective gives no per-unit guard)."""

    guard: str
    stock: float
    chosen: float
    change: float
    limit: float
    holds: bool
    low: float | None = None
    high: float | None = None
    units: int | None = None
    unit: str | None = None
    units_needed: int | None = None
    draws: int = 0
    seed: int = 0

    @property
    def verdict(self) -> str:
        return constraint_verdict(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict}


@dataclass(frozen=True)
class ChosenEffect:
    """The chosen setting's effect on the score on the held-out test split (:func:`test_score_effect`), its interval
    and the sentences that say it."""

    score: str
    stock: float
    chosen: float
    effect_name: str
    effect: float
    low: float
    high: float
    units: int
    unit: str
    draws: int
    seed: int
    verdict: str
    slope: SlopeInterval | None = None
    direction_text: str | None = None

    @property
    def reversed(self) -> bool:
        """The σ profile leans the other way beyond noise."""
        return self.slope is not None and self.slope.direction == "reversed"

    def to_dict(self) -> dict[str, Any]:
        """The flat record of ``tune.json`` (the slope's fields beside the effect's)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("slope", "direction_text")}
        if self.slope is not None:
            out |= asdict(self.slope)
        if self.direction_text is not None:
            out["direction_text"] = self.direction_text
        return out


def guard_change_interval(objective: Objective, calibration: Resolved, split: str) -> GuardChange | None:
    """The guard's change (``calibration`` minus stock) on ``split`` per unit, paired: its mean, 95 % bootstrap
    interval, unit count and standard deviation; None when the objective gives no per-unit guard or < 2 units.
    One rule for the test check (:func:`check_test_constraint`) and every trial's row (:func:`trial_intervals`)."""
    a, b = objective.guard_units(STOCK, split), objective.guard_units(calibration, split)
    if a is None or b is None:
        return None
    paired = (b - a).dropna()
    if len(paired) < 2:
        return None
    low, high = paired_mean_interval(paired.to_numpy(), draws=CHECK_DRAWS, seed=CHECK_SEED)
    return GuardChange(float(paired.mean()), low, high, len(paired), float(paired.std(ddof=1)))


def score_effect_interval(objective: Objective, calibration: Resolved, split: str) -> ScoreEffect | None:
    """``calibration``'s effect on the score on ``split`` (:meth:`Objective.score_effect`: the share of stock's
    score removed, or a higher-is-better score's change), with its 95 % bootstrap interval over the objective's
    units (:meth:`Objective.score_units`); None without per-unit scores."""
    if calibration is STOCK:
        return None
    groups = objective.score_units(calibration, split)
    if groups is None:
        return None
    low, high = grouped_interval(groups, objective.score_effect, draws=CHECK_DRAWS, seed=CHECK_SEED)
    slope = slope_interval(objective, groups) if objective.has_slope else None
    return ScoreEffect(objective.score_effect(groups), low, high, sum(len(g) for g in groups), slope)


#: the keys a slope adds to a trial's interval row (:meth:`TrialInterval.to_dict`) and the test effect's record
SLOPE_KEYS = ("stock_slope", "slope", "slope_low", "slope_high", "direction")


def slope_interval(objective: Objective, groups: list[np.ndarray]) -> SlopeInterval:
    """The calibrated profile's slope on position with its 95 % bootstrap interval over the same units and draws
    as the score's (:func:`score_effect_interval`), stock's slope, and the direction judged on that interval
    (:func:`~posfair.fairness.measures.slope_direction`: as stock / unresolved / reversed)."""
    stock, slope = objective.score_slope(groups, 0), objective.score_slope(groups, 1)
    low, high = grouped_interval(groups, lambda gs: objective.score_slope(gs, 1), draws=CHECK_DRAWS, seed=CHECK_SEED)
    return SlopeInterval(stock, slope, low, high, slope_direction(stock, low, high))


def trial_intervals(objective: Objective, trials: Sequence[Trial]) -> dict[str, TrialInterval]:
    """For every calibrated trial of both splits (keyed ``"<split>:<trial key>"``): the guard's change from stock
    with its paired interval and the effect on the score (:func:`score_effect_interval`) with its interval -- what
    the trial, front and variant tables show beside each setting, by the helpers of the test check."""
    out: dict[str, TrialInterval] = {}
    for t in trials:
        if t.stock:
            continue
        row = TrialInterval(
            guard_change_interval(objective, t.calibration, t.split),
            score_effect_interval(objective, t.calibration, t.split),
        )
        if row.guard is not None or row.effect is not None:
            out[f"{t.split}:{t.key}"] = row
    return out


def test_score_effect(
    objective: Objective, trials: Sequence[Trial], chosen: Resolved, score: str
) -> ChosenEffect | None:
    """The chosen setting's effect on the score on the held-out test split (:meth:`Objective.score_effect`: the
    share of stock's score it removes, or the change of a higher-is-better score), with a 95 % paired bootstrap
    interval over the objective's units (:meth:`Objective.score_units`); None when stock was chosen or the
    objective has no per-unit score (e.g. a function objective)."""
    interval = score_effect_interval(objective, chosen, TEST)
    if interval is None:
        return None
    effect, low, high, units, slope = interval.effect, interval.low, interval.high, interval.units, interval.slope
    fmt = objective.format_effect
    span = f"[95 % interval {fmt(low)}, {fmt(high)} over {units} {objective.unit}]"
    if objective.effect == "removed":
        head = f"on the held-out test split the chosen setting removes {fmt(effect)} of stock's {score} {span}"
        gain, none = "a reduction", "no reduction (or an increase)"
    else:
        head = f"on the held-out test split the chosen setting changes {score} by {fmt(effect)} {span}"
        gain, none = "an improvement", "no improvement (or a loss)"
    if low > 0 and slope is not None and slope.direction == "reversed":  # less spread, leaning the other way
        verdict = f"{head}, but the σ profile now leans the other way beyond noise: not a reduction of bias"
    elif low > 0:
        verdict = f"{head}: {gain} the interval supports"
    else:
        verdict = f"{head}: the interval includes {none}, so none is shown"
    return ChosenEffect(
        score=score,
        stock=find_trial(trials, STOCK, TEST).metrics[score],
        chosen=find_trial(trials, chosen, TEST).metrics[score],
        effect_name=objective.effect,
        effect=effect,
        low=low,
        high=high,
        units=units,
        unit=objective.unit,
        draws=CHECK_DRAWS,
        seed=CHECK_SEED,
        verdict=verdict,
        slope=slope,
        direction_text=None if slope is None else direction_text(slope, units, objective.unit),
    )


def direction_text(slope: SlopeInterval, units: int, unit: str) -> str:
    """One sentence on a calibrated profile's direction (:func:`slope_interval`)."""
    what = {
        "as stock": "it still leans as stock's does",
        "unresolved": "which way it leans is unresolved (the interval includes 0: flat, or too few units to tell)",
        "reversed": "REVERSED beyond noise: bias the other way, not bias removed",
    }[slope.direction]
    return (
        f"its σ slope on position is {slope.slope:+.4f} [95 % interval {slope.slope_low:+.4f}, "
        f"{slope.slope_high:+.4f} over {units} {unit}], stock's {slope.stock_slope:+.4f}: {what}"
    )


def check_test_constraint(
    objective: Objective, trials: Sequence[Trial], chosen: Resolved, guard: str, max_drop: float
) -> ConstraintCheck | None:
    """Does the chosen setting keep the constraint on the held-out test split?

    The guard's change (chosen minus stock, test split) against ``-max_drop`` by :func:`meets_constraint`,
    and a 95 % interval of that change: a paired bootstrap over the objective's units (segment sets for the
    fairness objective, queries for retrieval; :meth:`Objective.guard_units`), seeded.  None when stock
    was chosen (nothing to check).
    """
    if chosen is STOCK:
        return None
    stock_t, chosen_t = find_trial(trials, STOCK, TEST), find_trial(trials, chosen, TEST)
    stock, got = stock_t.metrics[guard], chosen_t.metrics[guard]
    g = guard_change_interval(objective, chosen, TEST)
    return ConstraintCheck(
        guard=guard,
        stock=stock,
        chosen=got,
        change=got - stock,
        limit=-max_drop,
        holds=meets_constraint(got, stock, max_drop),
        low=None if g is None else g.low,
        high=None if g is None else g.high,
        units=None if g is None else g.units,
        unit=None if g is None else objective.unit,
        units_needed=None if g is None else units_to_resolve(g.sd, max_drop),
        draws=CHECK_DRAWS,
        seed=CHECK_SEED,
    )


def constraint_verdict(check: ConstraintCheck) -> str:
    """One sentence on a :func:`check_test_constraint`: holds / holds within noise / broken."""
    limit, change = check.limit, check.change
    # in points (x100), as --max-recall-drop / --max-ndcg-drop give the limit
    interval = (
        ""
        if check.low is None
        else f" [95 % interval {100 * check.low:+.1f}, {100 * check.high:+.1f} over {check.units} {check.unit}]"
    )
    head = f"on the held-out test split {check.guard} changed by {100 * change:+.1f} points{interval}, limit {100 * limit:+.1f}: "
    if not check.holds:
        return head + "the constraint is BROKEN on the test split (the dev choice does not carry over)"
    if check.low is not None and check.low < limit:
        needed = check.units_needed
        size = (
            f" (an interval of ±{-100 * limit:.1f} points needs about {needed} {check.unit}; this split has {check.units})"
            if needed
            else ""
        )
        return (
            head
            + "the constraint holds, but the interval reaches beyond the limit: this split is too small to confirm it"
            + size
        )
    return head + "the constraint holds"
