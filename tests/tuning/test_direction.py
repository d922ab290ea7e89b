"""Flat, not reversed: the calibrated σ profile's slope with its interval, and its direction judged on that interval."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.fairness.measures import profile_slope, sets_slope, slope_direction
from posfair.stats.intervals import grouped_interval
from posfair.tuning import DEV, TEST, FairnessObjective, SearchSpace, default_fairness_settings, tune
from posfair.tuning.outputs import summary_markdown
from posfair.tuning.outputs import test_table as tuning_test_table
from posfair.tuning.verdicts import CHECK_DRAWS, CHECK_SEED, score_effect_interval
from posfair.tuning.verdicts import test_score_effect as chosen_test_effect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402


def test_direction_by_hand():
    # stock leans down (earlier positions represented better, the papers' finding)
    assert slope_direction(-0.02, -0.015, -0.005) == "as stock"
    assert slope_direction(-0.02, -0.004, +0.001) == "unresolved"
    assert slope_direction(-0.02, -0.001, +0.004) == "unresolved"  # a positive point estimate inside the noise
    assert slope_direction(-0.02, +0.001, +0.004) == "reversed"
    # stock leaning up: the same rule mirrored
    assert slope_direction(+0.02, -0.004, -0.001) == "reversed"
    assert slope_direction(+0.02, +0.001, +0.004) == "as stock"
    assert slope_direction(+0.02, 0.0, +0.004) == "unresolved"
    # no stock direction: nothing can be reversed
    assert slope_direction(0.0, +0.001, +0.004) == "as stock" and slope_direction(float("nan"), -1, 1) == "unresolved"


def _slope_by_polyfit(profile: np.ndarray) -> float:
    return float(np.polyfit(np.arange(1, len(profile) + 1), profile, 1)[0])


def test_sets_slope_is_the_mean_over_instances_of_the_slope_of_the_position_means():
    rng = np.random.default_rng(3)
    groups = [rng.normal(0.5, 0.05, size=(sets, 2, n)) for sets, n in ((5, 3), (4, 3), (6, 4))]
    for column in (0, 1):
        by_hand = np.mean([_slope_by_polyfit(g[:, column].mean(axis=0)) for g in groups])
        assert sets_slope(groups, column) == pytest.approx(by_hand, abs=1e-12)
    # and, per instance, the documents' profile_slope when every set weighs the same at every position
    g = groups[0]
    sigma = np.repeat(g[:, 1], 6, axis=0).ravel()  # 6 documents per set, each position once per document
    positions = np.tile(np.arange(1, 4), 5 * 6)
    assert profile_slope(sigma, positions) == pytest.approx(sets_slope([g], 1), abs=1e-12)


@pytest.fixture
def model(tiny_model):
    return tiny_model("bert-mean")


SETTINGS = default_fairness_settings(
    target_docs=24, min_segment_tokens=1, max_segment_tokens=60, batch_size=8, chunk_size=8
)


def test_the_tuner_reports_the_slope_with_its_interval_and_direction(model, tmp_path):
    obj = FairnessObjective(model, tiny_corpus(topics=12), SETTINGS, store=tmp_path / "cache")
    cal = Calibration(basket_size=4, layers=1.0, strength=1.0)
    for split in (DEV, TEST):
        groups = obj.score_units(cal, split)
        # the slope from the sets' profiles is the tuner's slope metric, computed from the documents
        assert obj.score_slope(groups, 0) == pytest.approx(obj.evaluate(STOCK, split)["slope"], abs=1e-9)
        assert obj.score_slope(groups, 1) == pytest.approx(obj.evaluate(cal, split)["slope"], abs=1e-9)
        got = score_effect_interval(obj, cal, split)
        # an independent bootstrap of the same statistic, the same draws and seed
        by_hand = np.mean([_slope_by_polyfit(x[:, 1].mean(axis=0)) for x in groups])
        low, high = grouped_interval(
            groups,
            lambda gs: float(np.mean([_slope_by_polyfit(x[:, 1].mean(axis=0)) for x in gs])),
            draws=CHECK_DRAWS,
            seed=CHECK_SEED,
        )
        assert got.slope.slope == pytest.approx(by_hand, abs=1e-12)
        assert (got.slope.slope_low, got.slope.slope_high) == pytest.approx((low, high), abs=1e-12)
        assert got.slope.direction == slope_direction(got.slope.stock_slope, low, high)
    space = SearchSpace(basket_sizes=(4,), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0,
                        variants=("uniform", "special"), special_shares=("original",))  # fmt: skip
    res = tune(model, objective=obj, space=space, max_drop=1.0)  # each variant's best is evaluated on test too
    if res.chosen is STOCK:  # the tiny random model may keep stock: the uniform variant's best, measured the same way
        res = dataclasses.replace(res, chosen=res.variant_best["uniform"])
        res.test_effect = chosen_test_effect(obj, res.trials, res.chosen, res.score)
    chosen = res.chosen
    want = score_effect_interval(obj, chosen, TEST)
    e = res.test_effect.slope
    assert (e.slope, e.slope_low, e.slope_high, e.direction) == (
        pytest.approx(want.slope.slope),
        pytest.approx(want.slope.slope_low),
        pytest.approx(want.slope.slope_high),
        want.slope.direction,
    )
    assert e.stock_slope == pytest.approx(res.trial(STOCK, TEST).metrics["slope"], abs=1e-9)
    summary = summary_markdown(res)
    assert f"Direction: its σ slope on position is {e.slope:+.4f}" in summary
    assert {"unresolved": "is unresolved", "as stock": "still leans", "reversed": "REVERSED"}[e.direction] in summary
    cells = tuning_test_table(res).frame
    row = cells[cells["setting"] == res.chosen_label].iloc[0]
    assert row["σ slope [95 %]"] == f"{e.slope:+.4f} [{e.slope_low:+.4f}, {e.slope_high:+.4f}] {e.direction}"
    head = res.headline()
    assert head["test_slope_low"] == pytest.approx(e.slope_low)
    assert head["test_profile_reversed_beyond_noise"] == float(e.direction == "reversed")
    # the sign-only sentence (item 4's "whether its sign flipped") says whether the flip is beyond noise
    text = res.test_reversal()
    if text is not None:
        assert ("beyond noise" if e.direction == "reversed" else "within noise") in text
