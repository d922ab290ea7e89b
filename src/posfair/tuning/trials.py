"""Choosing a calibration: grid search with a fine strength search, a constraint, a Pareto front, a held-out test.

The search runs on the *dev* split only:

1. the stock model (strength 0) gives the reference of the constraint;
2. the coarse grid basket size x layer set x strength;
3. the fine strength search: on the (basket size, layer set) line of the best
   coarse setting (the best feasible one; if none is feasible, the best-scoring
   one), each round evaluates the midpoints between the line's best strength and
   its evaluated neighbours (strength 0 = stock), for ``fine_rounds`` rounds.

A grid or fine point whose calibration changes none of the split's texts
(calibrated share 0: every document shorter than one basket, or exactly one;
:mod:`posfair.calibration.coverage`) is *skipped*: not evaluated, not a
candidate, listed in :attr:`TuneResult.skipped` and in the report.

Variants (``SearchSpace.variants``, see :class:`~posfair.Calibration`): every grid
point (basket size, layer set, strength) is tried as each variant -- ``uniform`` (the
papers' equal mass per basket), ``prior`` (positional-prior calibration; the prior is
estimated once on the dev split by the objective, per layer for every layer of the model,
and stored in each trial's calibration), ``self`` (one point per ``self_shares`` value)
and ``special`` (one point per ``special_shares`` value), or a combination of them named
with ``+`` (``prior+special``, ``self+special``, ...: one point per pairing of its parts'
values).  ``trailings`` adds the short-last-basket policy (``Calibration.trailing``) and ``schedules``
the per-layer strength schedule (``Calibration.schedule``) as grid dimensions.  The fine strength search
then runs on the best line of *each* variant (a line = every field but the strength),
the Pareto front is computed over all dev trials and per variant
(:attr:`TuneResult.fronts`), and the chosen setting is the best feasible one over all
variants.  On the test split, stock, the chosen setting and each variant's best feasible
dev setting are evaluated (the per-variant confirmation; none of them influences the choice).

A setting is *feasible* when its guard metric (own-segment recall@n for the
fairness objective, aggregate nDCG@10 for retrieval) drops by at most
``max_drop`` below the stock model's on the dev split.  The chosen setting is the
best-scoring feasible one (stock if none beats it); ties go to the lower strength.
Only then are the stock model and the chosen setting evaluated on the *test* split,
which therefore never influences the choice.

Objectives (:mod:`posfair.tuning.objectives`: :class:`FairnessObjective`,
:class:`RetrievalObjective`, or any :class:`Objective`, e.g. :class:`FunctionObjective`
wrapping a function) map ``(a Calibration or STOCK, split)`` to a dict of metrics.  Every trial is appended to
``tune.json`` (written atomically after each configuration) and every embedding
goes through the :class:`~posfair.store.EmbeddingStore`, so a killed run resumes
where it stopped and a re-run computes nothing.

The search logs each trial through :mod:`logging` (INFO) and, like sentence-transformers,
shows a tqdm bar over the trials when ``show_progress_bar`` is True (None: when this
module's logger is at INFO or DEBUG).
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from posfair._stack import user_stacklevel
from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.calibration.coverage import NOOP_LABEL
from posfair.calibration.params import SCHEDULES, TRAILING, VARIANTS, PositionalPrior
from posfair.errors import PosfairInputError
from posfair.fairness.measures import reversal_text, slope_direction
from posfair.intervals import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, grouped_interval, paired_mean_interval
from posfair.io import atomic_write_json
from posfair.progress import progress_enabled
from posfair.retrieval.grids import PAPER_BASKETS, PAPER_LAYERS, PAPER_STRENGTHS
from posfair.tuning.objectives import DEV, TEST, Objective

__all__ = ["RESULTS_FILE", "SearchSpace", "Trial", "TuneResult", "pareto_front", "run_search"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "tune.json"


def _strength(x: float) -> float:
    return round(float(x), 6)


@dataclass(frozen=True)
class SearchSpace:
    """Basket size x layer set x strength, then ``fine_rounds`` rounds of strength bisection.

    ``layer_sets``: as :class:`~posfair.Calibration` ``layers`` (int = last k layers,
    float = fraction: 1.0 = all layers, 0.5 = the last half).  The default (3 x 2 x 2 = 12
    settings plus at most 2 per fine round) keeps ``posfair tune`` on the bundled corpus and
    model to about a quarter of an hour on 2 CPU cores; :meth:`paper` is the papers' grid.
    """

    basket_sizes: tuple[int, ...] = (16, 64, 256)
    layer_sets: tuple[Any, ...] = (0.5, 1.0)
    strengths: tuple[float, ...] = (0.5, 1.0)
    fine_rounds: int = 2
    min_step: float = 0.02
    #: the calibration variants tried at every grid point (``uniform`` = the papers' formula)
    variants: tuple[str, ...] = ("uniform",)
    #: self-attention shares rho of the ``self`` variant
    self_shares: tuple[float, ...] = (0.5, 1.0)
    #: BOS / EOS shares of the ``special`` variant ("original", "equal" or floats in [0, 1))
    special_shares: tuple[Any, ...] = ("original",)
    #: the ``prior`` variant's prior (None: estimated by the objective on the dev split when the search starts)
    prior: PositionalPrior | None = None
    #: what a short last basket gets (``Calibration.trailing``), tried at every grid point; "basket" = the papers'
    trailings: tuple[str, ...] = ("basket",)
    #: how the strength is spread over the calibrated layers (``Calibration.schedule``); "flat" = the papers'
    schedules: tuple[str, ...] = ("flat",)

    def __post_init__(self) -> None:
        if not self.basket_sizes or not self.layer_sets or not self.strengths:
            raise PosfairInputError("the search space needs at least one basket size, layer set and strength")
        bad = [s for s in self.strengths if not 0 <= float(s) <= 1]
        if bad:
            raise PosfairInputError(f"grid strengths must be in [0, 1]; got {bad}")
        if all(float(s) == 0 for s in self.strengths):
            raise PosfairInputError(
                "grid strengths must include one above 0 (strength 0 is the stock model, always evaluated)"
            )
        # strength 0 is the stock model, which every search evaluates: not a grid point of its own
        object.__setattr__(self, "strengths", tuple(s for s in self.strengths if float(s) > 0))
        if self.fine_rounds < 0:
            raise PosfairInputError(f"fine_rounds must be >= 0; got {self.fine_rounds}")
        object.__setattr__(self, "basket_sizes", tuple(dict.fromkeys(int(b) for b in self.basket_sizes)))
        object.__setattr__(self, "strengths", tuple(sorted({_strength(s) for s in self.strengths})))
        layer_sets = [
            tuple(x) if isinstance(x, list) else x for x in self.layer_sets
        ]  # 1 (last layer) != 1.0 (all layers)
        object.__setattr__(self, "layer_sets", tuple({(type(x).__name__, x): x for x in layer_sets}.values()))
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise PosfairInputError(f"variants must be among {', '.join(VARIANTS)}; got {list(self.variants)}")
        object.__setattr__(self, "variants", tuple(dict.fromkeys(self.variants)))
        object.__setattr__(self, "self_shares", tuple(dict.fromkeys(float(x) for x in self.self_shares)))
        object.__setattr__(self, "special_shares", tuple(dict.fromkeys(self.special_shares)))
        bad = [t for t in self.trailings if t not in TRAILING]
        if bad or not self.trailings:
            raise PosfairInputError(
                f"trailing policies must be among {', '.join(TRAILING)}; got {list(self.trailings)}"
            )
        object.__setattr__(self, "trailings", tuple(dict.fromkeys(self.trailings)))
        bad = [t for t in self.schedules if t not in SCHEDULES]
        if bad or not self.schedules:
            raise PosfairInputError(
                f"strength schedules must be among {', '.join(SCHEDULES)}; got {list(self.schedules)}"
            )
        object.__setattr__(self, "schedules", tuple(dict.fromkeys(self.schedules)))
        if self.prior is not None:
            object.__setattr__(self, "prior", PositionalPrior.from_dict(self.prior))
        try:
            for rho in self.self_shares:
                Calibration(self_share=rho)
            for share in self.special_shares:
                Calibration().with_special(share)
        except ValueError as exc:
            raise PosfairInputError(str(exc)) from None
        if not any("prior" in v.split("+") for v in self.variants):
            self.coarse()  # validates every combination (with a prior: once it is known)

    @classmethod
    def paper(cls, fine_rounds: int = 2) -> SearchSpace:
        """The papers' grid (:func:`posfair.retrieval.grids.paper_grid`): {128, 256, 512} x {last layer, last 50%} x {0.5, 1.0}."""
        return cls(
            basket_sizes=PAPER_BASKETS, layer_sets=PAPER_LAYERS, strengths=PAPER_STRENGTHS, fine_rounds=fine_rounds
        )

    def expand(self, base: Calibration) -> list[Calibration]:
        """``base`` (the papers' formula) as every variant of the space; a combination (``"self+special"``) takes
        every pairing of its parts' values (each of ``self_shares`` with each of ``special_shares``)."""
        out: list[Calibration] = []
        for v in self.variants:
            parts = () if v == "uniform" else tuple(v.split("+"))
            cals = [base]
            if "prior" in parts:
                if self.prior is None:
                    raise PosfairInputError(
                        "the prior variant needs a positional prior (SearchSpace.prior, or estimated by the objective)"
                    )
                cals = [replace(c, prior=self.prior) for c in cals]
            if "self" in parts:
                cals = [replace(c, self_share=rho) for c in cals for rho in self.self_shares]
            if "special" in parts:
                cals = [c.with_special(share) for c in cals for share in self.special_shares]
            out.extend(cals)
        return out

    def coarse(self) -> list[Calibration]:
        return [
            cal
            for b in self.basket_sizes
            for layers in self.layer_sets
            for a in self.strengths
            for t in self.trailings
            for sch in self.schedules
            for cal in self.expand(Calibration(basket_size=b, layers=layers, strength=a, trailing=t, schedule=sch))
        ]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "basket_sizes": list(self.basket_sizes),
            "layer_sets": [list(x) if isinstance(x, tuple) else x for x in self.layer_sets],
            "strengths": list(self.strengths),
            "fine_rounds": self.fine_rounds,
            "min_step": self.min_step,
        }
        if self.variants != ("uniform",):  # the default space keeps its old form
            d.update(
                variants=list(self.variants),
                self_shares=list(self.self_shares),
                special_shares=list(self.special_shares),
            )
        if self.trailings != ("basket",):  # likewise
            d["trailings"] = list(self.trailings)
        if self.schedules != ("flat",):
            d["schedules"] = list(self.schedules)
        return d


@dataclass
class Trial:
    """One configuration evaluated on one split."""

    calibration: Resolved
    split: str
    phase: str  # "stock", "coarse", "fine" or "test" ("skipped" for a no-op grid point, never evaluated)
    metrics: dict[str, float]
    seconds: float = 0.0
    #: fraction of the split's texts the calibration changes (None: stock, or the objective cannot tell)
    calibrated_share: float | None = None

    @property
    def label(self) -> str:
        return self.calibration.label()

    @property
    def key(self) -> str:
        return self.calibration.key()

    @property
    def stock(self) -> bool:
        return self.calibration is STOCK

    @property
    def strength(self) -> float:
        return 0.0 if self.stock else self.calibration.strength

    @property
    def line(self) -> Calibration | None:
        """The calibration with strength 0 (every field but the strength: the fine search's line); None for stock."""
        return None if self.stock else replace(self.calibration, strength=0.0)

    @property
    def variant(self) -> str:
        return STOCK.label() if self.stock else self.calibration.variant

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "key": self.key,
            "calibration": None if self.stock else self.calibration.to_dict(),
            "split": self.split,
            "phase": self.phase,
            "metrics": {k: _num(v) for k, v in self.metrics.items()},
            "seconds": self.seconds,
            "calibrated_share": self.calibrated_share,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        cal = Calibration.from_dict(d["calibration"]) if d.get("calibration") else STOCK
        metrics = {k: (float("nan") if v is None else float(v)) for k, v in d["metrics"].items()}
        share = d.get("calibrated_share")
        return cls(
            cal, d["split"], d["phase"], metrics, float(d.get("seconds", 0.0)), None if share is None else float(share)
        )


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def meets_constraint(guard: float, stock_guard: float, max_drop: float) -> bool:
    """The constraint, one rule for the dev choice and the test check: the guard metric (higher is better)
    at most ``max_drop`` below stock's on the same split."""
    return bool(guard >= stock_guard - max_drop - 1e-12)


class ConstraintWarning(UserWarning):
    """The setting chosen on the dev split breaks the constraint on the held-out test split."""


#: paired bootstrap of the test split's guard change: draws and seed (recorded with the check)
CHECK_DRAWS, CHECK_SEED = BOOTSTRAP_DRAWS, BOOTSTRAP_SEED


#: z for a two-sided 95 % normal interval, in the number of units a constraint needs (:func:`units_to_resolve`)
_Z95 = 1.959963984540054


def guard_change_interval(objective: Objective, calibration: Resolved, split: str) -> dict[str, Any] | None:
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
    return {
        "change": float(paired.mean()),
        "low": low,
        "high": high,
        "units": len(paired),
        "sd": float(paired.std(ddof=1)),
    }


def units_to_resolve(sd: float, max_drop: float) -> int | None:
    """How many units a paired comparison needs before its 95 % interval is no wider than ``±max_drop``
    (normal approximation, ``n = (1.96 sd / max_drop)^2``, ``sd`` = the paired differences' standard deviation);
    None when ``max_drop`` is 0 (no finite sample resolves it)."""
    if max_drop <= 0:
        return None
    return max(2, math.ceil((_Z95 * sd / max_drop) ** 2))


def score_effect_interval(objective: Objective, calibration: Resolved, split: str) -> dict[str, Any] | None:
    """``calibration``'s effect on the score on ``split`` (:meth:`Objective.score_effect`: the share of stock's
    score removed, or a higher-is-better score's change), with its 95 % bootstrap interval over the objective's
    units (:meth:`Objective.score_units`); None without per-unit scores."""
    if calibration is STOCK:
        return None
    groups = objective.score_units(calibration, split)
    if groups is None:
        return None
    low, high = grouped_interval(groups, objective.score_effect, draws=CHECK_DRAWS, seed=CHECK_SEED)
    out = {"effect": objective.score_effect(groups), "low": low, "high": high, "units": sum(len(g) for g in groups)}
    if objective.has_slope:
        out.update(slope_interval(objective, groups))
    return out


#: the keys :func:`slope_interval` adds to a score interval (and so to the trial intervals and the test effect)
SLOPE_KEYS = ("stock_slope", "slope", "slope_low", "slope_high", "direction")


def slope_interval(objective: Objective, groups: list[np.ndarray]) -> dict[str, Any]:
    """The calibrated profile's slope on position with its 95 % bootstrap interval over the same units and draws
    as the score's (:func:`score_effect_interval`), stock's slope, and the direction judged on that interval
    (:func:`~posfair.fairness.measures.slope_direction`: as stock / unresolved / reversed)."""
    stock, slope = objective.score_slope(groups, 0), objective.score_slope(groups, 1)
    low, high = grouped_interval(groups, lambda gs: objective.score_slope(gs, 1), draws=CHECK_DRAWS, seed=CHECK_SEED)
    return {
        "stock_slope": stock,
        "slope": slope,
        "slope_low": low,
        "slope_high": high,
        "direction": slope_direction(stock, low, high),
    }


def trial_intervals(objective: Objective, result: TuneResult) -> dict[str, dict[str, Any]]:
    """For every calibrated trial of both splits (keyed ``"<split>:<trial key>"``): the guard's change from stock
    with its paired interval and the effect on the score (:func:`score_effect_interval`) with its interval -- what the trial, front
    and variant tables show beside each setting, by the helpers of the test check."""
    out: dict[str, dict[str, Any]] = {}
    for t in result.trials:
        if t.stock:
            continue
        row: dict[str, Any] = {}
        g = guard_change_interval(objective, t.calibration, t.split)
        if g is not None:
            row.update(guard_change=g["change"], guard_low=g["low"], guard_high=g["high"], units=g["units"])
        r = score_effect_interval(objective, t.calibration, t.split)
        if r is not None:
            row.update(effect=r["effect"], effect_low=r["low"], effect_high=r["high"], units=r["units"])
            row.update({k: r[k] for k in SLOPE_KEYS if k in r})
        if row:
            out[f"{t.split}:{t.key}"] = row
    return out


def interval_verdict(low: float, high: float, limit: float) -> str:
    """The guard's constraint judged on its interval: ``holds`` (the whole interval above ``limit``), ``broken``
    (the whole interval below), else ``unresolved`` (the data cannot tell)."""
    if low >= limit - 1e-12:
        return "holds"
    if high < limit:
        return "broken"
    return "unresolved"


def test_score_effect(objective: Objective, result: TuneResult) -> dict[str, Any] | None:
    """The chosen setting's effect on the score on the held-out test split (:meth:`Objective.score_effect`: the
    share of stock's score it removes, or the change of a higher-is-better score), with a 95 % paired bootstrap
    interval over the objective's units (:meth:`Objective.score_units`); None when stock was chosen or the
    objective has no per-unit score (e.g. a function objective)."""
    interval = score_effect_interval(objective, result.chosen, TEST)
    if interval is None:
        return None
    effect, low, high, units = interval["effect"], interval["low"], interval["high"], interval["units"]
    slope = {k: interval[k] for k in SLOPE_KEYS if k in interval}
    out = slope | {
        "score": result.score,
        "stock": result.trial(STOCK, TEST).metrics[result.score],
        "chosen": result.trial(result.chosen, TEST).metrics[result.score],
        "effect_name": objective.effect,
        "effect": effect,
        "low": low,
        "high": high,
        "units": units,
        "unit": objective.unit,
        "draws": CHECK_DRAWS,
        "seed": CHECK_SEED,
    }
    fmt = objective.format_effect
    interval = f"[95 % interval {fmt(low)}, {fmt(high)} over {units} {objective.unit}]"
    if objective.effect == "removed":
        head = (
            f"on the held-out test split the chosen setting removes {fmt(effect)} of stock's {result.score} {interval}"
        )
        gain, none = "a reduction", "no reduction (or an increase)"
    else:
        head = f"on the held-out test split the chosen setting changes {result.score} by {fmt(effect)} {interval}"
        gain, none = "an improvement", "no improvement (or a loss)"
    if low > 0 and slope.get("direction") == "reversed":  # less spread, but leaning the other way: not bias removed
        out["verdict"] = f"{head}, but the σ profile now leans the other way beyond noise: not a reduction of bias"
    elif low > 0:
        out["verdict"] = f"{head}: {gain} the interval supports"
    else:
        out["verdict"] = f"{head}: the interval includes {none}, so none is shown"
    if slope:
        out["direction_text"] = direction_text(slope, units, objective.unit)
    return out


def direction_text(slope: dict[str, Any], units: int, unit: str) -> str:
    """One sentence on a calibrated profile's direction (:func:`slope_interval`'s keys)."""
    what = {
        "as stock": "it still leans as stock's does",
        "unresolved": "which way it leans is unresolved (the interval includes 0: flat, or too few units to tell)",
        "reversed": "REVERSED beyond noise: bias the other way, not bias removed",
    }[slope["direction"]]
    return (
        f"its σ slope on position is {slope['slope']:+.4f} [95 % interval {slope['slope_low']:+.4f}, "
        f"{slope['slope_high']:+.4f} over {units} {unit}], stock's {slope['stock_slope']:+.4f}: {what}"
    )


def check_test_constraint(objective: Objective, result: TuneResult) -> dict[str, Any] | None:
    """Does the chosen setting keep the constraint on the held-out test split?

    The guard's change (chosen minus stock, test split) against ``-max_drop`` by :func:`meets_constraint`,
    and a 95 % interval of that change: a paired bootstrap over the objective's units (segment sets for the
    fairness objective, queries for retrieval; :meth:`Objective.guard_units`), seeded.  None when stock
    was chosen (nothing to check).
    """
    if result.chosen is STOCK:
        return None
    guard = result.guard
    stock_t, chosen_t = result.trial(STOCK, TEST), result.trial(result.chosen, TEST)
    change = chosen_t.metrics[guard] - stock_t.metrics[guard]
    out: dict[str, Any] = {
        "guard": guard,
        "stock": stock_t.metrics[guard],
        "chosen": chosen_t.metrics[guard],
        "change": change,
        "limit": -result.max_drop,
        "holds": meets_constraint(chosen_t.metrics[guard], stock_t.metrics[guard], result.max_drop),
        "low": None,
        "high": None,
        "units": None,
        "unit": None,
        "units_needed": None,
        "draws": CHECK_DRAWS,
        "seed": CHECK_SEED,
    }
    g = guard_change_interval(objective, result.chosen, TEST)
    if g is not None:
        out.update(low=g["low"], high=g["high"], units=g["units"], unit=objective.unit)
        out["units_needed"] = units_to_resolve(g["sd"], result.max_drop)
    out["verdict"] = constraint_verdict(out)
    return out


def constraint_verdict(check: dict[str, Any]) -> str:
    """One sentence on a :func:`check_test_constraint`: holds / holds within noise / broken."""
    limit, change = check["limit"], check["change"]
    # in points (x100), as --max-recall-drop / --max-ndcg-drop give the limit
    interval = (
        ""
        if check["low"] is None
        else f" [95 % interval {100 * check['low']:+.1f}, {100 * check['high']:+.1f} over {check['units']} {check['unit']}]"
    )
    head = (
        f"on the held-out test split {check['guard']} changed by {100 * change:+.1f} points{interval}, "
        f"limit {100 * limit:+.1f}: "
    )
    if not check["holds"]:
        return head + "the constraint is BROKEN on the test split (the dev choice does not carry over)"
    if check["low"] is not None and check["low"] < limit:
        needed = check.get("units_needed")
        size = (
            f" (an interval of ±{-100 * limit:.1f} points needs about {needed} {check['unit']}; this split has {check['units']})"
            if needed
            else ""
        )
        return (
            head
            + "the constraint holds, but the interval reaches beyond the limit: this split is too small to confirm it"
            + size
        )
    return head + "the constraint holds"


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


@dataclass
class TuneResult:
    """The search's outcome: every trial, the chosen setting, the Pareto front and the test-split figures."""

    objective: dict[str, Any]
    space: dict[str, Any]
    max_drop: float
    trials: list[Trial]
    chosen: Resolved
    front: list[Trial] = field(default_factory=list)
    feasible: bool = True
    seconds: float = 0.0
    #: grid points that calibrate nothing on the dev split (calibrated share 0): not evaluated, not candidates
    skipped: list[Trial] = field(default_factory=list)
    #: the Pareto front of each variant's dev trials (stock included in each)
    fronts: dict[str, list[Trial]] = field(default_factory=dict)
    #: each variant's best feasible dev setting (None: no feasible setting of that variant), evaluated on test
    variant_best: dict[str, Calibration | None] = field(default_factory=dict)
    #: the chosen setting's constraint on the test split (:func:`check_test_constraint`; None: stock chosen)
    test_check: dict[str, Any] | None = None
    test_effect: dict[str, Any] | None = None
    #: every calibrated trial's intervals, ``"<split>:<key>"`` -> :func:`trial_intervals`' row
    intervals: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: what the intervals' score effect measures (:attr:`Objective.effect`: "removed", or a change such as "Δharm")
    effect: str = "removed"
    #: where :func:`posfair.tuning.tune` saved the tuned model (None: not asked, or refused: see ``save_refused``)
    saved_model: str | None = None
    #: why the tuned model was not saved (the chosen setting failed on the test split; None: saved or not asked)
    save_refused: str | None = None

    @property
    def score(self) -> str:
        return self.objective["score"]

    @property
    def guard(self) -> str:
        return self.objective["guard"]

    def dev_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.split == DEV]

    def trial(self, calibration: Resolved, split: str) -> Trial:
        key = calibration.key()
        for t in self.trials:
            if t.key == key and t.split == split:
                return t
        raise KeyError(f"no {split} trial of {calibration.label()}")

    @property
    def chosen_label(self) -> str:
        return self.chosen.label()

    def test_metrics(self) -> dict[str, dict[str, float]]:
        """``{"stock": ..., "chosen": ...}`` on the test split."""
        return {"stock": self.trial(STOCK, TEST).metrics, "chosen": self.trial(self.chosen, TEST).metrics}

    def headline(self) -> dict[str, float]:
        """Flat dict (evaluator style): dev and test figures of stock and the chosen setting."""
        out: dict[str, float] = {}
        for split in (DEV, TEST):
            for who, cal in (("stock", STOCK), ("chosen", self.chosen)):
                for k, v in self.trial(cal, split).metrics.items():
                    out[f"{split}_{who}_{k}"] = float(v)
        if self.chosen is not STOCK:
            out.update(chosen_basket_size=float(self.chosen.basket_size), chosen_strength=self.chosen.strength)
            for split in (DEV, TEST):
                share = self.trial(self.chosen, split).calibrated_share
                if share is not None:
                    out[f"{split}_chosen_calibrated_share"] = float(share)
        out["feasible"] = float(self.feasible)
        if self.test_effect is not None:
            out["test_score_effect"] = float(self.test_effect["effect"])
            out["test_score_effect_low"] = float(self.test_effect["low"])
            out["test_score_effect_high"] = float(self.test_effect["high"])
            if "slope_low" in self.test_effect:
                out["test_slope_low"] = float(self.test_effect["slope_low"])
                out["test_slope_high"] = float(self.test_effect["slope_high"])
                out["test_profile_reversed_beyond_noise"] = float(self.test_effect["direction"] == "reversed")
        if self.test_reversal() is not None:
            out["test_profile_reversed"] = 1.0
        out["skipped"] = float(len(self.skipped))
        if self.test_check is not None:
            out["test_constraint_holds"] = float(self.test_check["holds"])
            out["test_guard_change"] = float(self.test_check["change"])
            if self.test_check["low"] is not None:
                out["test_guard_change_low"], out["test_guard_change_high"] = (
                    float(self.test_check["low"]),
                    float(self.test_check["high"]),
                )
        return out

    def frame(self, split: str = DEV) -> pd.DataFrame:
        """One row per trial of ``split``: label, phase, basket, layers, strength, metrics, feasible, on_front."""
        stock = self.trial(STOCK, split).metrics.get(self.guard, np.nan) if split == DEV else np.nan
        front = {t.key for t in self.front}
        rows = []
        for t in self.trials:
            if t.split != split:
                continue
            c = t.calibration
            row = {
                "label": t.label,
                "phase": t.phase,
                "variant": t.variant,
                "basket_size": None if t.stock else c.basket_size,
                "layers": None if t.stock else str(c.layers),
                "strength": t.strength,
                "calibrated_share": np.nan if t.calibrated_share is None else t.calibrated_share,
                **t.metrics,
            }
            iv = self.intervals.get(f"{split}:{t.key}", {})
            for k in ("guard_change", "guard_low", "guard_high", "effect", "effect_low", "effect_high"):
                row[k] = iv.get(k, np.nan)
            if "direction" in iv:
                row.update(slope_low=iv["slope_low"], slope_high=iv["slope_high"], direction=iv["direction"])
            if "guard_low" in iv:
                row["constraint_on_interval"] = interval_verdict(iv["guard_low"], iv["guard_high"], -self.max_drop)
            if split == DEV:
                row["feasible"] = meets_constraint(t.metrics[self.guard], stock, self.max_drop)
                row["on_front"] = t.key in front
                row["on_variant_front"] = any(t.key == o.key for o in self.fronts.get(t.variant, []))
            row["chosen"] = t.key == self.chosen.key()
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "space": self.space,
            "max_drop": self.max_drop,
            "trials": [t.to_dict() for t in self.trials],
            "chosen": None if self.chosen is STOCK else self.chosen.to_dict(),
            "chosen_label": self.chosen_label,
            "front": [t.label for t in self.front],
            "feasible": self.feasible,
            "seconds": self.seconds,
            "skipped": [t.to_dict() for t in self.skipped],
            "fronts": {v: [t.label for t in f] for v, f in self.fronts.items()},
            "variant_best": {v: (c.label() if c is not None else None) for v, c in self.variant_best.items()},
            "test_check": self.test_check,
            "test_effect": self.test_effect,
            "test_reversal": self.test_reversal(),
            "intervals": self.intervals,
            "effect": self.effect,
        }

    def failures(self) -> list[str]:
        """The checks the chosen setting fails on the held-out test split, each in a few words (empty: none failed,
        or stock was chosen): the constraint broken on the point estimate, the σ profile reversed beyond noise."""
        out = []
        c = self.test_check
        if c is not None and not c["holds"]:
            name = {"recall": "recall@n", "ndcg@10": "nDCG@10"}.get(c["guard"], c["guard"])
            interval = "" if c["low"] is None else f" [95 % interval {100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
            out.append(
                f"the constraint is broken: {name} changed by {100 * c['change']:+.1f} points{interval}, "
                f"the limit is {100 * c['limit']:+.1f}"
            )
        if (self.test_effect or {}).get("direction") == "reversed":
            e = self.test_effect
            out.append(
                f"the σ profile is reversed beyond noise: slope on position {e['slope']:+.4f} [95 % interval "
                f"{e['slope_low']:+.4f}, {e['slope_high']:+.4f}], stock's {e['stock_slope']:+.4f} (bias the other way)"
            )
        return out

    def test_reversal(self) -> str | None:
        """The sentence when the chosen setting reverses the σ profile on the held-out test split (its σ slope on
        position has the other sign than stock's), else None (also for objectives without a slope)."""
        s = self.trial(STOCK, TEST).metrics.get("slope")
        c = self.trial(self.chosen, TEST).metrics.get("slope")
        if s is None or c is None:
            return None
        text = reversal_text(s, c, f"on the held-out test split the chosen {self.chosen_label}")
        e = self.test_effect or {}
        if text is not None and "direction" in e:
            judged = "the reversal is beyond noise" if e["direction"] == "reversed" else "a sign flip within noise"
            text += f" (the slope's 95 % interval is {e['slope_low']:+.4f}, {e['slope_high']:+.4f}: {judged})"
        return text


def _load_trials(path: Path, objective: dict[str, Any]) -> list[Trial]:
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    old = json.loads(json.dumps(saved.get("objective"), default=str))
    new = json.loads(json.dumps(objective, default=str))
    if old != new:
        old = old if isinstance(old, dict) else {}
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise PosfairInputError(
            f"{path} holds a search of a different objective, model or data (differs in: {', '.join(differ)}); "
            "its trials cannot be reused: use another output directory"
        )
    return [Trial.from_dict(d) for d in saved.get("trials", [])]


class _Search:
    """The state of one search: the trials so far (evaluated or read back from ``tune.json``), the skipped
    no-op grid points, the progress bar and the log; :meth:`trial` evaluates one configuration on one split."""

    def __init__(
        self,
        objective: Objective,
        space: SearchSpace,
        max_drop: float,
        path: Path | None,
        log: Callable[[str], None] | None,
        show_progress_bar: bool | None,
        total: int,
    ):
        self.objective, self.space, self.max_drop, self.path, self.log = objective, space, max_drop, path, log
        self.desc = objective.describe()
        self.done = {(t.key, t.split): t for t in (_load_trials(path, self.desc) if path else [])}
        self.trials: list[Trial] = []
        self.skipped: list[Trial] = []
        self.sign = 1.0 if objective.greater_is_better else -1.0
        self.bar = tqdm(
            total=total, desc="tuning trials", unit="trial", disable=not progress_enabled(show_progress_bar, logger)
        )
        self.stock: Trial | None = None

    def say(self, msg: str) -> None:
        logger.info(msg)
        if self.log is not None:
            self.log(msg)

    def save(self, extra: dict[str, Any] | None = None) -> None:
        """``tune.json`` rewritten atomically: every trial so far (a killed search loses no finished trial)."""
        if self.path is not None:
            body = {
                "objective": self.desc,
                "space": self.space.to_dict(),
                "max_drop": self.max_drop,
                "trials": [t.to_dict() for t in self.trials],
                "skipped": [t.to_dict() for t in self.skipped],
            }
            atomic_write_json(self.path, body | (extra or {}))

    def _known(self, key: tuple[str, str]) -> tuple[bool, Trial | None]:
        for t in self.trials:
            if (t.key, t.split) == key:
                return True, t
        return any((t.key, t.split) == key for t in self.skipped), None

    def trial(self, cal: Resolved, split: str, phase: str) -> Trial | None:
        """The trial of ``cal`` on ``split`` (evaluated, or read back); None for a no-op calibration (skipped)."""
        key = (cal.key(), split)
        known, t = self._known(key)
        if known:
            return t
        share = None if cal is STOCK else self.objective.calibrated_share(cal, split)
        if (
            share is not None and share == 0 and phase in ("coarse", "fine")
        ):  # the test split reports the choice whatever it is
            self.skipped.append(Trial(cal, split, "skipped", {}, 0.0, 0.0))
            self._record(f"{split:>4} {phase:<6} {cal.label():<22} skipped: {NOOP_LABEL} (calibrated share 0)")
            return None
        t = self._read_back(key, phase, share) if key in self.done else self._evaluate(cal, split, phase, share)
        self.trials.append(t)
        shown = "" if share is None else f" calibrated_share={share:.3f}"
        o = self.objective
        self._record(
            f"{split:>4} {phase:<6} {t.label:<22} {o.score}={t.metrics[o.score]:.4f} {o.guard}={t.metrics[o.guard]:.4f}{shown}"
        )
        return t

    def _read_back(self, key: tuple[str, str], phase: str, share: float | None) -> Trial:
        t = self.done[key]
        t.phase = phase
        if t.calibrated_share is None:
            t.calibrated_share = share
        return t

    def _evaluate(self, cal: Resolved, split: str, phase: str, share: float | None) -> Trial:
        o = self.objective
        s0 = time.perf_counter()
        metrics = o.evaluate(cal, split)
        for name in (o.score, o.guard):
            if name not in metrics:
                raise PosfairInputError(f"objective {o.name!r} returned no {name!r} metric (got {sorted(metrics)})")
        return Trial(cal, split, phase, {k: float(v) for k, v in metrics.items()}, time.perf_counter() - s0, share)

    def _record(self, line: str) -> None:
        self.save()
        self.bar.update()
        self.say(line)

    # -- the choice rule (the test check uses the same meets_constraint) --------------------------
    def feasible(self, t: Trial) -> bool:
        return t.stock or meets_constraint(
            t.metrics[self.objective.guard], self.stock.metrics[self.objective.guard], self.max_drop
        )

    def rank(self, t: Trial) -> tuple[float, float]:
        """Smaller is better; ties go to the lower strength."""
        return (-self.sign * t.metrics[self.objective.score], t.strength)

    def dev(self) -> list[Trial]:
        return [t for t in self.trials if t.split == DEV]

    # -- the phases ---------------------------------------------------------------------------------
    def coarse(self, grid: list[Calibration]) -> list[Trial]:
        coarse = [t for t in (self.trial(c, DEV, "coarse") for c in grid) if t is not None]
        if self.skipped:
            labels = ", ".join(t.label for t in self.skipped)
            self.say(
                f"skipped {len(self.skipped)} of {len(grid)} grid points: {NOOP_LABEL} on the dev split ({labels})"
            )
        return coarse

    def lines(self, coarse: list[Trial]) -> list[Calibration]:
        """The fine search's line of each variant: its best coarse setting (feasible if any) at strength 0."""
        out = []
        for v in self.space.variants:
            of_v = [t for t in coarse if t.variant == v]
            if of_v:
                out.append(min([t for t in of_v if self.feasible(t)] or of_v, key=self.rank).line)
        return out

    def fine(self, line: Calibration) -> None:
        """Bisect the strength along ``line`` around the best feasible point, ``fine_rounds`` times."""
        for _ in range(self.space.fine_rounds):
            on_line = [self.stock] + [t for t in self.dev() if t.line == line]
            best = min([t for t in on_line if self.feasible(t)], key=self.rank)
            strengths = sorted({t.strength for t in on_line})
            i = strengths.index(best.strength)
            mids = [(strengths[j] + best.strength) / 2 for j in (i - 1, i + 1) if 0 <= j < len(strengths)]
            new = [m for m in mids if abs(m - best.strength) >= self.space.min_step / 2]
            if not new:
                return
            self.bar.total += len(new)
            self.bar.refresh()
            for m in new:
                self.trial(replace(line, strength=_strength(m)), DEV, "fine")  # same line: never a no-op

    def choose(self) -> tuple[Trial, bool, list[Trial], dict[str, list[Trial]], dict[str, Calibration | None]]:
        """The pick (best feasible dev trial), whether any calibration is feasible, the front, each variant's
        front and best feasible setting."""
        o, dev = self.objective, self.dev()
        pick = min([t for t in dev if self.feasible(t)], key=self.rank)
        any_feasible = any(self.feasible(t) for t in dev if not t.stock)
        front = pareto_front(dev, o.score, o.guard, o.greater_is_better)
        fronts, variant_best = {}, {}
        for v in self.space.variants:
            of_v = [t for t in dev if t.variant == v]
            fronts[v] = pareto_front([self.stock, *of_v], o.score, o.guard, o.greater_is_better)
            ok = [t for t in of_v if self.feasible(t)]
            variant_best[v] = min(ok, key=self.rank).calibration if ok else None
        if all(t.stock for t in dev):
            self.say(f"chosen: {pick.label} (every grid point was a no-op: nothing calibrated)")
        else:
            self.say(f"chosen: {pick.label}" + ("" if any_feasible else " (no calibration satisfies the constraint)"))
        return pick, any_feasible, front, fronts, variant_best

    def confirm_on_test(self, pick: Trial, variant_best: dict[str, Calibration | None]) -> None:
        """Only now does the test split enter: stock, the choice, and each variant's best feasible dev setting."""
        self.trial(STOCK, TEST, "test")
        if not pick.stock:
            self.trial(pick.calibration, TEST, "test")
        if len(self.space.variants) > 1:
            extra = [c for c in variant_best.values() if c is not None and c != pick.calibration]
            self.bar.total += len(extra)
            for c in extra:
                self.trial(c, TEST, "test")


def run_search(
    objective: Objective,
    space: SearchSpace | None = None,
    *,
    max_drop: float = 0.02,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    show_progress_bar: bool | None = None,
) -> TuneResult:
    """Search ``space`` on the dev split, choose under the constraint, then evaluate stock and the choice on test.

    ``max_drop``: the most the guard metric may fall below stock on dev (in its own units:
    0.02 = 2 points of recall or nDCG@10).  ``results_path``: ``tune.json``, rewritten
    atomically after every trial and read back on a re-run (finished trials are not redone).
    ``log``: called with each line the search logs (INFO on this module's logger), e.g. to
    print them.  ``show_progress_bar``: a tqdm bar over the trials (None: shown when this
    module's logger is at INFO or DEBUG).
    """
    space = space or SearchSpace()
    if any("prior" in v.split("+") for v in space.variants) and space.prior is None:
        estimate = getattr(objective, "estimate_prior", None)
        if estimate is None:
            raise PosfairInputError(
                f"objective {objective.name!r} cannot estimate a positional prior: give SearchSpace(prior=...)"
            )
        space = replace(space, prior=estimate())
    if max_drop < 0:
        raise PosfairInputError(f"max_drop must be >= 0; got {max_drop}")
    t0 = time.perf_counter()
    path = Path(results_path) if results_path is not None else None
    grid = space.coarse()
    # stock + the grid + stock and the choice on test; each fine point adds one as it comes
    search = _Search(objective, space, max_drop, path, log, show_progress_bar, total=len(grid) + 3)
    try:
        search.stock = search.trial(STOCK, DEV, "stock")
        coarse = search.coarse(grid)
        for line in search.lines(coarse):
            search.fine(line)
        pick, any_feasible, front, fronts, variant_best = search.choose()
        search.confirm_on_test(pick, variant_best)
        result = TuneResult(
            search.desc,
            space.to_dict(),
            max_drop,
            search.trials,
            pick.calibration,
            front,
            any_feasible,
            time.perf_counter() - t0,
            list(search.skipped),
            fronts,
            variant_best,
            effect=objective.effect,
        )
        result.intervals = trial_intervals(objective, result)
        result.test_check = check_test_constraint(objective, result)
        result.test_effect = test_score_effect(objective, result)
        if result.test_effect is not None:
            search.say(result.test_effect["verdict"])
        if result.test_check is not None:
            search.say(result.test_check["verdict"])
            if not result.test_check["holds"]:
                warnings.warn(
                    f"{result.chosen_label}: {result.test_check['verdict']}",
                    ConstraintWarning,
                    stacklevel=user_stacklevel(),
                )
        search.save(result.to_dict())
        search.bar.total = search.bar.n  # the choice may be stock: evaluated on test once
    finally:
        search.bar.close()
    return result
