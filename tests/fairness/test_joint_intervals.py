"""Intervals under the clusters the data really has (posfair.stats.clusters.joint_ols): the joint CR1 covariance
against statsmodels, component clustering against a hand-made one, the more conservative of component and two-way,
Fieller's ratio interval, and the "toward 0" sign rule."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from posfair.fairness.families import change_direction
from posfair.stats.clusters import fieller, joint_ols
from posfair.stats.position_ols import position_design
from shared_topics import shared_topic_table as _table


def _sm(y, X, groups):
    return sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)


def test_joint_covariance_against_statsmodels_and_a_hand_made_component_clustering():
    d = _table()
    X = position_design(d["position"].to_numpy(), 3)
    Y = d[["stock", "cal"]].to_numpy()
    fit = joint_ols(X, Y, d["set"], d["topic"])
    st_comp, V_comp, _ = fit.variants["component"]
    st_two, V_two, _ = fit.variants["set+topic"]
    assert (st_comp.n_sets, st_comp.n_components, st_comp.G) == (8, 5, 5)
    assert st_two.G == 8 and st_two.shared_topics == 3
    codes = np.column_stack([pd.factorize(d["set"])[0], pd.factorize(d["topic"])[0]])
    for j, col in enumerate(["stock", "cal"]):
        y = d[col].to_numpy()
        block = slice(3 * j, 3 * j + 3)
        # components: statsmodels one-way on the components drawn by hand
        ref = _sm(y, X, d["component"].to_numpy())
        np.testing.assert_allclose(fit.params[block], ref.params, rtol=1e-10)
        np.testing.assert_allclose(V_comp[block, block], ref.cov_params(), rtol=1e-9)
        # two-way: statsmodels with two group columns
        ref2 = _sm(y, X, codes)
        np.testing.assert_allclose(V_two[block, block], ref2.cov_params(), rtol=1e-9)
    # the off-diagonal blocks: the change (calibrated minus stock) has the variance of the paired difference's own fit
    diff = d["cal"].to_numpy() - d["stock"].to_numpy()
    for V, groups in ((V_comp, d["component"].to_numpy()), (V_two, codes)):
        ref = _sm(diff, X, groups)
        for p in (1, 2):
            a = fit.coef(1, p) - fit.coef(0, p)
            assert a @ fit.params == pytest.approx(ref.params[p], rel=1e-10)
            assert a @ V @ a == pytest.approx(ref.cov_params()[p, p], rel=1e-9)


def test_every_interval_is_the_more_conservative_clustering_and_says_so():
    d = _table(1)
    X = position_design(d["position"].to_numpy(), 3)
    fit = joint_ols(X, d[["stock", "cal"]].to_numpy(), d["set"], d["topic"])
    codes = np.column_stack([pd.factorize(d["set"])[0], pd.factorize(d["topic"])[0]])
    diff = d["cal"].to_numpy() - d["stock"].to_numpy()
    for y, a in ((d["stock"].to_numpy(), fit.coef(0, 2)), (diff, fit.coef(1, 2) - fit.coef(0, 2))):
        comp = _sm(y, X, d["component"].to_numpy()).conf_int()[2]  # t(G-1) with G = 5 components
        two = _sm(y, X, codes).conf_int()[2]  # t(G-1) with G = min(8 sets, 21 topics)
        got = fit.linear(a)
        wider, G, word = (comp, 5, "components") if comp[1] - comp[0] >= two[1] - two[0] else (two, 8, "set+topic")
        np.testing.assert_allclose([got.ci_low, got.ci_high], wider, rtol=1e-9)
        assert got.G == G and got.clusters.startswith(word)
        other = two if word == "components" else comp
        np.testing.assert_allclose(got.other, other, rtol=1e-9)


def test_disjoint_sets_use_the_sets_and_say_so():
    d = _table(2)
    d["topic"] = d["set"] + "/" + d["topic"]  # no topic in two sets
    X = position_design(d["position"].to_numpy(), 3)
    fit = joint_ols(X, d[["stock"]].to_numpy(), d["set"], d["topic"])
    got = fit.linear(fit.coef(0, 1))
    ref = _sm(d["stock"].to_numpy(), X, pd.factorize(d["set"])[0])
    np.testing.assert_allclose([got.ci_low, got.ci_high], ref.conf_int()[1], rtol=1e-9)
    assert got.G == 8 and got.clusters.startswith("sets (8 sets, no topic in two sets")
    assert got.p == pytest.approx(ref.pvalues[1], rel=1e-8)


def test_fieller_against_its_definition_and_unbounded():
    # the interval holds the ratios r whose (num - r den) is not rejected at the t quantile
    num, den, vn, vd, c, crit = 0.03, -0.08, 0.0001, 0.0002, 0.00005, stats.t.ppf(0.975, 11)
    lo, hi = fieller(num, den, vn, vd, c, crit)
    for r in (lo, hi):
        assert (num - r * den) ** 2 == pytest.approx(crit**2 * (vn - 2 * r * c + r**2 * vd), rel=1e-9)
    assert lo < num / den < hi
    assert np.isnan(fieller(num, 0.01, vn, vd, c, crit)).all()  # denominator within crit SEs of 0: unbounded


def test_share_removed_is_one_minus_calibrated_over_stock_with_a_fieller_interval():
    d = _table(3)
    X = position_design(d["position"].to_numpy(), 3)
    fit = joint_ols(X, d[["stock", "cal"]].to_numpy(), d["set"], d["topic"])
    share = fit.ratio(fit.coef(0, 2) - fit.coef(1, 2), fit.coef(0, 2))
    b_s, b_c = fit.params[2], fit.params[5]
    assert share.estimate == pytest.approx(1 - b_c / b_s, rel=1e-12)
    st, V, _ = fit.variants["component" if share.clusters.startswith("components") else "set+topic"]
    a_n, a_d = fit.coef(0, 2) - fit.coef(1, 2), fit.coef(0, 2)
    crit = stats.t.ppf(0.975, st.G - 1)
    expect = fieller(a_n @ fit.params, a_d @ fit.params, a_n @ V @ a_n, a_d @ V @ a_d, a_n @ V @ a_d, crit)
    np.testing.assert_allclose([share.ci_low, share.ci_high], expect, rtol=1e-12)
    assert share.ci_low < share.estimate < share.ci_high


@pytest.mark.parametrize(
    ("stock", "calibrated", "interval", "expected"),
    [
        (-0.10, -0.05, (0.03, 0.07), "toward 0"),
        (0.06, 0.03, (-0.04, -0.02), "toward 0"),
        (-0.10, -0.15, (-0.07, -0.03), "away from 0"),
        (-0.10, -0.09, (-0.02, 0.04), "no change"),  # the interval holds 0
        # |calibrated| < |stock| but the sign flipped: past 0, never "toward 0"
        (-0.10, +0.04, (0.10, 0.18), "past 0 (sign flipped)"),
        (0.05, -0.02, (-0.09, -0.05), "past 0 (sign flipped)"),
        # the sign is kept but the interval is on the wrong side of 0 for the estimates (cannot be "toward 0")
        (-0.10, -0.08, (-0.01, -0.005), "away from 0"),
    ],
)
def test_toward_zero_needs_the_sign_kept_and_the_interval_on_the_right_side(stock, calibrated, interval, expected):
    assert change_direction(stock, calibrated, *interval) == expected
