"""The outcome of a search (:class:`TuneResult`): every trial, the chosen setting, the Pareto fronts and the
held-out test split's figures and verdicts (:mod:`posfair.tuning.verdicts`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.fairness.measures import reversal_text
from posfair.stats.intervals import (
    interval_verdict,
)
from posfair.tuning.objectives import DEV, TEST
from posfair.tuning.space import Trial, find_trial
from posfair.tuning.verdicts import ChosenEffect, ConstraintCheck, TrialInterval, meets_constraint

__all__ = ["TuneResult"]


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
    test_check: ConstraintCheck | None = None
    #: the chosen setting's effect on the score on the test split (:func:`test_score_effect`; None: stock chosen)
    test_effect: ChosenEffect | None = None
    #: every calibrated trial's intervals, ``"<split>:<key>"`` -> :func:`trial_intervals`' row
    intervals: dict[str, TrialInterval] = field(default_factory=dict)
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
        return find_trial(self.trials, calibration, split)

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
        e = self.test_effect
        if e is not None:
            out["test_score_effect"] = float(e.effect)
            out["test_score_effect_low"] = float(e.low)
            out["test_score_effect_high"] = float(e.high)
            if e.slope is not None:
                out["test_slope_low"] = float(e.slope.slope_low)
                out["test_slope_high"] = float(e.slope.slope_high)
                out["test_profile_reversed_beyond_noise"] = float(e.reversed)
        if self.test_reversal() is not None:
            out["test_profile_reversed"] = 1.0
        out["skipped"] = float(len(self.skipped))
        c = self.test_check
        if c is not None:
            out["test_constraint_holds"] = float(c.holds)
            out["test_guard_change"] = float(c.change)
            if c.low is not None:
                out["test_guard_change_low"], out["test_guard_change_high"] = float(c.low), float(c.high)
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
            got = self.intervals.get(f"{split}:{t.key}")
            iv = {} if got is None else got.to_dict()
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
            "test_check": None if self.test_check is None else self.test_check.to_dict(),
            "test_effect": None if self.test_effect is None else self.test_effect.to_dict(),
            "test_reversal": self.test_reversal(),
            "intervals": {key: iv.to_dict() for key, iv in self.intervals.items()},
            "effect": self.effect,
        }

    def failures(self) -> list[str]:
        """The checks the chosen setting fails on the held-out test split, each in a few words (empty: none failed,
        or stock was chosen): the constraint broken on the point estimate, the σ profile reversed beyond noise."""
        out = []
        c = self.test_check
        if c is not None and not c.holds:
            name = {"recall": "recall@n", "ndcg@10": "nDCG@10"}.get(c.guard, c.guard)
            interval = "" if c.low is None else f" [95 % interval {100 * c.low:+.1f}, {100 * c.high:+.1f}]"
            out.append(
                f"the constraint is broken: {name} changed by {100 * c.change:+.1f} points{interval}, "
                f"the limit is {100 * c.limit:+.1f}"
            )
        if self.test_effect is not None and self.test_effect.reversed:
            s = self.test_effect.slope
            out.append(
                f"the σ profile is reversed beyond noise: slope on position {s.slope:+.4f} [95 % interval "
                f"{s.slope_low:+.4f}, {s.slope_high:+.4f}], stock's {s.stock_slope:+.4f} (bias the other way)"
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
        s = None if self.test_effect is None else self.test_effect.slope
        if text is not None and s is not None:
            judged = "the reversal is beyond noise" if s.direction == "reversed" else "a sign flip within noise"
            text += f" (the slope's 95 % interval is {s.slope_low:+.4f}, {s.slope_high:+.4f}: {judged})"
        return text
