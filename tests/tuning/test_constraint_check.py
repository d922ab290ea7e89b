"""The chosen setting's constraint, checked on the held-out test split, with a paired interval."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from posfair.calibration import STOCK
from posfair.tuning import DEV, TEST, FunctionObjective, SearchSpace, run_search
from posfair.tuning.outputs import summary_markdown
from posfair.tuning.verdicts import CHECK_DRAWS, ConstraintWarning, meets_constraint

SPACE = SearchSpace(basket_sizes=(16, 64), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=0)


class UnitObjective(FunctionObjective):
    """Score falls with strength on both splits; the guard is the mean of per-unit values: unchanged on dev,
    and on test each unit loses ``test_drop * strength`` plus seeded noise of ``noise``."""

    unit = "segment sets"

    def __init__(self, test_drop: float, noise: float = 0.0, n_units: int = 40):
        self.test_drop, self.noise, self.n = test_drop, noise, n_units
        super().__init__(self._metrics, score="score", guard="recall")

    def guard_units(self, cal, split):
        strength = cal.strength if cal is not STOCK else 0.0
        base = np.linspace(0.6, 0.9, self.n)
        if split == TEST and cal is not STOCK:
            base = base - self.test_drop * strength + self.noise * np.random.default_rng(7).standard_normal(self.n)
        return pd.Series(base, index=[f"s{i}" for i in range(self.n)])

    def _metrics(self, cal, split):
        return {
            "score": 1.0 - (cal.strength if cal is not STOCK else 0.0),
            "recall": float(self.guard_units(cal, split).mean()),
        }


def test_a_choice_that_breaks_the_constraint_on_test_is_said(tmp_path):
    with pytest.warns(ConstraintWarning, match="BROKEN on the test split"):
        res = run_search(UnitObjective(test_drop=0.10), SPACE, max_drop=0.02, results_path=tmp_path / "tune.json")
    assert res.chosen is not STOCK and res.chosen.strength == 1.0  # feasible on dev: recall unchanged there
    check = res.test_check
    stock, chosen = res.trial(STOCK, TEST).metrics["recall"], res.trial(res.chosen, TEST).metrics["recall"]
    assert check.change == pytest.approx(chosen - stock) == pytest.approx(-0.10)
    assert check.holds is False and check.limit == -0.02
    assert check.low == pytest.approx(-0.10) and check.high == pytest.approx(-0.10)  # every unit lost the same
    assert check.units == 40 and check.unit == "segment sets" and check.draws == CHECK_DRAWS
    assert "BROKEN" in summary_markdown(res) and "over 40 segment sets" in summary_markdown(res)
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["test_check"]["holds"] is False and saved["test_check"]["change"] == pytest.approx(-0.10)
    head = res.headline()
    assert head["test_constraint_holds"] == 0.0 and head["test_guard_change_low"] == pytest.approx(-0.10)


def test_the_interval_against_the_normal_approximation():
    res = run_search(UnitObjective(test_drop=0.0, noise=0.05, n_units=400), SPACE, max_drop=0.02)
    check = res.test_check
    diff = UnitObjective(0.0, 0.05, 400).guard_units(res.chosen, TEST) - UnitObjective(0.0, 0.05, 400).guard_units(
        STOCK, TEST
    )
    m, se = diff.mean(), diff.std(ddof=1) / np.sqrt(len(diff))
    assert check.change == pytest.approx(m)
    assert check.low == pytest.approx(m - 1.96 * se, abs=0.25 * se) and check.high == pytest.approx(
        m + 1.96 * se, abs=0.25 * se
    )
    assert check.holds is True  # mean change about 0
    assert ("interval reaches beyond the limit" in check.verdict) == (check.low < -0.02)


def test_the_dev_choice_and_the_test_check_use_one_rule():
    assert meets_constraint(0.88, 0.90, 0.02) and not meets_constraint(0.8799, 0.90, 0.02)
    res = run_search(UnitObjective(test_drop=0.0), SPACE, max_drop=0.02)
    f = res.frame(DEV)
    stock = res.trial(STOCK, DEV).metrics["recall"]
    assert (f["feasible"] == [meets_constraint(g, stock, 0.02) for g in f["recall"]]).all()
    assert res.test_check.holds is True and "the constraint holds" in res.test_check.verdict


def test_stock_chosen_needs_no_check():
    def fn(cal, split):  # every calibration loses 0.2 * strength of the guard on both splits: none is feasible
        strength = cal.strength if cal is not STOCK else 0.0
        return {"score": 1.0 - strength, "recall": 1.0 - 0.2 * strength}

    res = run_search(FunctionObjective(fn, guard="recall"), SPACE, max_drop=0.05)
    assert res.chosen is STOCK and res.test_check is None and "test_constraint_holds" not in res.headline()


class SlopeObjective(UnitObjective):
    """As UnitObjective (guard unchanged), plus a σ slope: stock leans to position 1 (-0.05 per position); a
    calibration of strength s has slope -0.05 + 0.08 s on the test split (strength 1 reverses it)."""

    def _metrics(self, cal, split):
        s = cal.strength if cal is not STOCK else 0.0
        return super()._metrics(cal, split) | {"slope": -0.05 + (0.08 * s if split == TEST else 0.04 * s)}


def test_a_choice_that_reverses_the_profile_on_test_is_said(tmp_path):
    res = run_search(SlopeObjective(test_drop=0.0), SPACE, max_drop=0.02, results_path=tmp_path / "tune.json")
    assert res.chosen is not STOCK and res.chosen.strength == 1.0
    text = res.test_reversal()
    assert text is not None and "reverses the σ profile (slope +0.0300 per position, stock -0.0500)" in text
    assert f"warning: on the held-out test split the chosen {res.chosen_label} reverses" in summary_markdown(res)
    assert json.loads((tmp_path / "tune.json").read_text())["test_reversal"] == text
    assert res.headline()["test_profile_reversed"] == 1.0
    # a setting that only flattens the profile is not called a reversal
    flat = run_search(SlopeObjective(test_drop=0.0), SearchSpace(basket_sizes=(16,), layer_sets=(0.5,),
                      strengths=(0.5,), fine_rounds=0), max_drop=0.02)  # fmt: skip
    assert flat.test_reversal() is None and "test_profile_reversed" not in flat.headline()


def test_every_trial_carries_its_interval_and_the_constraint_judged_on_it(tmp_path):
    """Each calibrated trial of both splits: the guard's change from stock with the paired bootstrap interval (by an
    explicit draw loop here), the constraint on that interval, in the frame, the tables and tune.json; and how many
    units an interval of ±max_drop would need."""
    obj = UnitObjective(test_drop=0.03, noise=0.04, n_units=30)
    with pytest.warns(ConstraintWarning):
        res = run_search(obj, SPACE, max_drop=0.02, results_path=tmp_path / "tune.json")
    for split in (DEV, TEST):
        f = res.frame(split).set_index("label")
        for t in (t for t in res.trials if t.split == split and not t.stock):
            d = (obj.guard_units(t.calibration, split) - obj.guard_units(STOCK, split)).to_numpy()
            rng = np.random.default_rng(0)  # posfair.stats.intervals' seed and draws: resample units with replacement
            means = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(CHECK_DRAWS)]
            lo, hi = np.quantile(means, 0.025), np.quantile(means, 0.975)
            row = f.loc[t.label]
            assert row["guard_change"] == pytest.approx(d.mean())
            assert (row["guard_low"], row["guard_high"]) == (pytest.approx(lo), pytest.approx(hi))
            want = "holds" if lo >= -0.02 else ("broken" if hi < -0.02 else "unresolved")
            assert row["constraint_on_interval"] == want
    test = res.frame(TEST).set_index("label")
    # on test the strength-1 choice loses 0.03 +- noise: its interval lies below -0.02 or straddles it; never "holds"
    assert test.loc[res.chosen_label, "constraint_on_interval"] in ("broken", "unresolved")
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["intervals"][f"test:{res.chosen.key()}"]["guard_low"] == pytest.approx(
        test.loc[res.chosen_label, "guard_low"]
    )
    from posfair.tuning.outputs import trials_table

    cells = trials_table(res).frame
    assert "on interval" in cells.columns and cells.filter(like="[95 %]").shape[1] == 1
    # units needed for ±0.02: (1.96 sd / 0.02)^2 with sd of the test split's paired differences
    d = (obj.guard_units(res.chosen, TEST) - obj.guard_units(STOCK, TEST)).to_numpy()
    assert res.test_check.units_needed == int(np.ceil((1.959963984540054 * d.std(ddof=1) / 0.02) ** 2))


def test_per_unit_scores_without_their_reader_are_refused_by_name():
    """An objective that gives score_units but no score_effect is told which method it lacks, not left to a bare
    NotImplementedError; with score_effect its interval comes out of the same bootstrap."""
    from posfair import Calibration
    from posfair.tuning.verdicts import score_effect_interval

    class Units(FunctionObjective):
        def score_units(self, calibration, split):
            return [np.array([[1.0, 0.5], [1.0, 0.25], [1.0, 0.75]])]

    class Reads(Units):
        def score_effect(self, groups):
            return float(1 - np.mean([g[:, 1].mean() / g[:, 0].mean() for g in groups]))

    cal = Calibration(basket_size=16, layers=0.5, strength=1.0)
    with pytest.raises(TypeError, match="Units gives score_units but must define score_effect"):
        score_effect_interval(Units(lambda c, s: {"score": 1.0, "guard": 1.0}), cal, TEST)
    got = score_effect_interval(Reads(lambda c, s: {"score": 1.0, "guard": 1.0}), cal, TEST)
    assert got.units == 3 and 0.25 <= got.low <= 0.5 <= got.high <= 0.75
    assert score_effect_interval(Reads(lambda c, s: {}), STOCK, TEST) is None


def test_the_verdicts_are_typed_values_and_tune_json_keeps_flat_records(tmp_path):
    """The test check, the test effect and every trial's intervals are frozen dataclasses (fields, not dict keys
    read by name across modules); tune.json writes them as the flat records it always held."""
    from dataclasses import FrozenInstanceError

    from posfair.tuning.verdicts import ChosenEffect, ConstraintCheck, TrialInterval

    with pytest.warns(ConstraintWarning):
        res = run_search(UnitObjective(test_drop=0.10), SPACE, max_drop=0.02, results_path=tmp_path / "tune.json")
    check = res.test_check
    assert isinstance(check, ConstraintCheck) and check.holds is False and "BROKEN" in check.verdict
    with pytest.raises(FrozenInstanceError):
        check.holds = True
    assert res.intervals and all(isinstance(iv, TrialInterval) for iv in res.intervals.values())
    assert res.test_effect is None or isinstance(res.test_effect, ChosenEffect)
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert set(saved["test_check"]) == {"guard", "stock", "chosen", "change", "limit", "holds", "low", "high", "units",
                                        "unit", "units_needed", "draws", "seed", "verdict"}  # fmt: skip
    assert saved["test_check"]["verdict"] == check.verdict and saved["test_check"]["units"] == check.units == 40
    row = saved["intervals"][next(iter(res.intervals))]
    assert {"guard_change", "guard_low", "guard_high", "units"} <= set(row)
