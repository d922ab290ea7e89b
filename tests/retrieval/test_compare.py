"""Settings against stock on the same queries: changes and paired intervals by hand."""

import numpy as np
import pytest

from posfair.retrieval.compare import differences_from_stock, differences_table, verdict
from posfair.retrieval.evaluator import RetrievalResult


def _result(setting, method, ndcg, groups):
    ndcg = np.asarray(ndcg, dtype=float)
    means = {g: float(ndcg[idx].mean()) for g, idx in groups.items()}
    harm = len(means) / sum(1 / m for m in means.values())
    return RetrievalResult(
        benchmark="b", setting=setting, method=method, calibration=None, query_ids=[f"q{i}" for i in range(len(ndcg))],
        ndcg=ndcg, recall=ndcg.copy(), metrics={"ndcg@10": float(ndcg.mean()), "harm": harm}, groups=means,
        group_queries=groups,
    )  # fmt: skip


GROUPS = {"seg 1": [0, 1, 2, 3], "seg 2": [4, 5, 6, 7]}


def test_changes_and_intervals_by_hand():
    stock = _result("stock", "stock", [1, 1, 0.5, 1, 0.2, 0.3, 0.5, 0.4], GROUPS)
    better = _result("late", "late", [1, 1, 0.6, 1, 0.6, 0.7, 0.8, 0.7], GROUPS)  # every seg-2 query gains
    same = _result("sea", "sea", stock.ndcg, GROUPS)
    d = differences_from_stock([stock, better, same]).set_index("setting")
    diff = better.ndcg - stock.ndcg
    assert d.loc["late", "d_ndcg"] == pytest.approx(100 * diff.mean())
    rng = np.random.default_rng(0)  # the documented draws: 2000 x 8 picks with replacement
    means = diff[rng.integers(0, 8, size=(2000, 8))].mean(axis=1)
    assert d.loc["late", "d_ndcg_low"] == pytest.approx(100 * np.quantile(means, 0.025))
    assert d.loc["late", "d_ndcg_high"] == pytest.approx(100 * np.quantile(means, 0.975))
    # Harm by hand: stock group means .875 / .35, late .9 / .7
    h_stock, h_late = 2 / (1 / 0.875 + 1 / 0.35), 2 / (1 / 0.9 + 1 / 0.7)
    assert d.loc["late", "d_harm"] == pytest.approx(100 * (h_late - h_stock))
    assert d.loc["late", "ndcg_verdict"] == "higher" and d.loc["late", "harm_verdict"] == "higher"
    assert d.loc["late", "d_harm_low"] > 0
    # PSI = 1 - min / max of the group means: stock 1 - .35/.875 = .6, late 1 - .7/.9 = .2222
    assert d.loc["late", "d_psi"] == pytest.approx((1 - 0.7 / 0.9) - (1 - 0.35 / 0.875))
    draws = []  # the documented resampling: each group's queries within the group, one generator, groups in order
    rng = np.random.default_rng(0)
    picks = [rng.integers(0, 4, size=(2000, 4)) for _ in GROUPS]
    for b in range(2000):
        sm = [stock.ndcg[np.array(idx)[p[b]]].mean() for idx, p in zip(GROUPS.values(), picks, strict=True)]
        lm = [better.ndcg[np.array(idx)[p[b]]].mean() for idx, p in zip(GROUPS.values(), picks, strict=True)]
        draws.append((1 - min(lm) / max(lm)) - (1 - min(sm) / max(sm)))
    assert d.loc["late", "d_psi_low"] == pytest.approx(np.quantile(draws, 0.025))
    assert d.loc["late", "d_psi_high"] == pytest.approx(np.quantile(draws, 0.975))
    assert d.loc["late", "psi_verdict"] == "lower" and d.loc["sea", "psi_verdict"] == "no difference shown"
    # identical to stock: no difference, a zero-width interval
    assert (d.loc["sea", "d_ndcg"], d.loc["sea", "d_ndcg_low"], d.loc["sea", "d_ndcg_high"]) == (0, 0, 0)
    assert d.loc["sea", "ndcg_verdict"] == "no difference shown"
    table = differences_table([stock, better, same])
    assert table.frame.loc["late", "nDCG@10 vs stock"] == "higher" and "2000 draws, seed 0" in table.caption
    assert table.frame.loc["late", "PSI vs stock"] == "lower" and table.frame.loc[
        "late", "ΔPSI [95 % interval]"
    ].startswith("-0.378 [")


def test_verdict_and_refusals():
    assert verdict(0.1, 2) == "higher" and verdict(-2, -0.1) == "lower" and verdict(-1, 1) == "no difference shown"
    assert verdict(0, 1) == "no difference shown"
    stock = _result("stock", "stock", [1, 0.5], {"seg 1": [0], "seg 2": [1]})
    other = _result("x", "late", [1, 0.5, 0.2], {"seg 1": [0], "seg 2": [1, 2]})
    with pytest.raises(ValueError, match="not evaluated on the same queries"):
        differences_from_stock([stock, other])
    assert differences_from_stock([other]).empty and differences_table([other]) is None
