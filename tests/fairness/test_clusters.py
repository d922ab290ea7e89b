"""Clustering by set and topic: the two-way CR1 covariance against pyfixest, statsmodels and the
Cameron-Gelbach-Miller formula by hand; components; the two-way wild bootstrap against a slow loop."""

import itertools
import warnings

import numpy as np
import pandas as pd
import pyfixest as pf
import pytest
import statsmodels.api as sm
from scipy import stats

from posfair.stats.clusters import cluster_structure, connected_components
from posfair.stats.inference import FewClustersWarning, Inference
from posfair.stats.position_ols import fit_position_ols, position_design
from posfair.stats.wild import wild_tests


def _reused(seed=0, sets=10, topics=14, n=3, noise=0.02):
    """Permutation data whose segment sets reuse topics (each set draws n of ``topics``); a topic effect makes
    observations of one topic correlated across sets."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, 0.08, topics)
    rows = []
    for s in range(sets):
        pick = rng.choice(topics, n, replace=False)
        u = rng.normal(0, 0.03)
        for perm in itertools.permutations(range(n)):
            for p, k in enumerate(perm, start=1):
                y = 0.6 - 0.02 * (p - 1) + effect[pick[k]] + u + rng.normal(0, noise)
                rows.append({"set": f"s{s:02d}", "topic": f"t{pick[k]:02d}", "position": p, "y": y})
    return pd.DataFrame(rows)


def _cr1(X, u, codes):
    """One-way CR1 meat-and-bread by hand: G/(G-1) (N-1)/(N-K) A (sum_g s_g s_g') A."""
    A = np.linalg.inv(X.T @ X)
    N, K = X.shape
    meat = np.zeros((K, K))
    for g in np.unique(codes):
        sg = X[codes == g].T @ u[codes == g]
        meat += np.outer(sg, sg)
    G = len(np.unique(codes))
    return G / (G - 1) * (N - 1) / (N - K) * A @ meat @ A


def _quiet(*a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)
        return fit_position_ols(*a, **k)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_way_cr1_against_pyfixest_statsmodels_and_the_formula(seed):
    d = _reused(seed)
    st = cluster_structure(d["set"], d["topic"], "set+topic")
    assert st.shared_topics > 0 and st.codes.ndim == 2  # the data really reuse topics
    fit = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=Inference(clusters="set+topic"))
    X = position_design(d["position"].to_numpy(), 3)
    y = d["y"].to_numpy()
    u = y - X @ fit.params
    both = (d["set"] + "|" + d["topic"]).to_numpy()
    V = _cr1(X, u, d["set"].to_numpy()) + _cr1(X, u, d["topic"].to_numpy()) - _cr1(X, u, both)
    np.testing.assert_allclose(fit.bse, np.sqrt(np.diag(V)), rtol=1e-9)
    G = min(d["set"].nunique(), d["topic"].nunique())
    assert fit.n_clusters == G
    np.testing.assert_allclose(fit.pvalues, 2 * stats.t.sf(np.abs(fit.params / fit.bse), G - 1), rtol=1e-8)
    # statsmodels with two group columns
    codes = np.column_stack([pd.factorize(d["set"])[0], pd.factorize(d["topic"])[0]])
    ref = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    np.testing.assert_allclose(fit.bse, ref.bse, rtol=1e-10)
    # pyfixest (fixest's conventions; "conventional" = each dimension's own G in its small-sample correction)
    e = d.assign(p2=(d["position"] == 2).astype(float), p3=(d["position"] == 3).astype(float))
    m = pf.feols("y ~ p2 + p3", data=e, vcov={"CRV1": "set+topic"}, ssc=pf.ssc(cluster_df="conventional"))
    np.testing.assert_allclose(fit.params, m.coef().to_numpy(), rtol=1e-10)
    np.testing.assert_allclose(fit.bse, m.se().to_numpy(), rtol=1e-8)
    np.testing.assert_allclose(fit.pvalues, m.pvalue().to_numpy(), rtol=1e-6)
    assert fit.cluster_by == f"set+topic ({d['set'].nunique()} sets, {d['topic'].nunique()} topics)"


def test_one_way_set_clustering_against_pyfixest():
    d = _reused(4)
    fit = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=Inference(clusters="set"))
    e = d.assign(p2=(d["position"] == 2).astype(float), p3=(d["position"] == 3).astype(float))
    m = pf.feols("y ~ p2 + p3", data=e, vcov={"CRV1": "set"})
    np.testing.assert_allclose(fit.bse, m.se().to_numpy(), rtol=1e-8)
    np.testing.assert_allclose(fit.pvalues, m.pvalue().to_numpy(), rtol=1e-6)
    assert fit.n_clusters == d["set"].nunique() and fit.inference == "CR1 set t(G-1)"


def test_disjoint_sets_two_way_is_exactly_one_way():
    """No topic in two sets: set+topic gives the papers' set-clustered numbers (the default costs nothing)."""
    d = _reused(5, sets=4, topics=12, n=3)
    # make the sets disjoint: topics renamed per set
    d["topic"] = d["set"] + "/" + d["topic"]
    two = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=Inference(clusters="set+topic"))
    one = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=Inference(clusters="set"))
    np.testing.assert_array_equal(two.bse, one.bse)
    np.testing.assert_array_equal(two.pvalues, one.pvalues)
    assert two.n_clusters == one.n_clusters == 4


def test_connected_components_by_hand():
    sets = ["a", "a", "b", "b", "c", "c", "d"]
    topics = ["x", "y", "y", "z", "u", "v", "z"]
    # a-y-b-z-d are one component; c (u, v) another
    comp = connected_components(sets, topics)
    assert comp.tolist() == [0, 0, 0, 0, 1, 1, 0]
    st = cluster_structure(sets, topics, "component")
    assert (st.n_sets, st.n_topics, st.n_components, st.shared_topics, st.G) == (4, 5, 2, 2, 2)


def test_component_clustering_equals_one_way_on_components():
    d = _reused(6, sets=12, topics=30)
    fit = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=Inference(clusters="component"))
    comp = connected_components(d["set"], d["topic"])
    X = position_design(d["position"].to_numpy(), 3)
    u = d["y"].to_numpy() - X @ fit.params
    np.testing.assert_allclose(fit.bse, np.sqrt(np.diag(_cr1(X, u, comp))), rtol=1e-9)
    assert fit.n_clusters == comp.max() + 1


def _slow_two_way_t(X, y, sets, topics, j, v_by_boot, boot):
    """One bootstrap t by loops: restricted fit, y* = fitted + v u, refit, two-way CR1 variance by _cr1."""
    keep = [c for c in range(X.shape[1]) if c != j]
    br = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
    fitted = X[:, keep] @ br
    ystar = fitted + v_by_boot[boot] * (y - fitted)
    b = np.linalg.solve(X.T @ X, X.T @ ystar)
    u = ystar - X @ b
    both = np.array([f"{a}|{c}" for a, c in zip(sets, topics, strict=True)])
    V = _cr1(X, u, sets) + _cr1(X, u, topics) - _cr1(X, u, both)
    return b[j] / np.sqrt(V[j, j])


def test_two_way_wild_bootstrap_against_a_slow_loop():
    d = _reused(7, sets=6, topics=9, n=3, noise=0.05)
    X = position_design(d["position"].to_numpy(), 3)
    y = d["y"].to_numpy()
    st = cluster_structure(d["set"], d["topic"], "set+topic")
    assert st.n_sets < st.n_topics  # weights per set
    inf = Inference("wild", weights="rademacher", draws=999, clusters="set+topic")  # 2^6 < 999: enumerated
    t, p = wild_tests(X, y, st, inf)
    sets, topics = d["set"].to_numpy(), d["topic"].to_numpy()
    boot = st.bootstrap_codes
    for j in range(3):
        t_boot = []
        for signs in itertools.product([1.0, -1.0], repeat=6):
            t_boot.append(_slow_two_way_t(X, y, sets, topics, j, np.array(signs), boot))
        t_boot = np.array(t_boot)
        expected = np.mean(np.abs(t_boot) >= abs(t[j]) * (1 - 1e-9))
        assert p[j] == pytest.approx(expected, abs=1e-12)
    fit = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"])
    np.testing.assert_allclose(t, fit.tvalues, rtol=1e-9)
    wild = _quiet(d["y"], d["position"], d["set"], n=3, topics=d["topic"], inference=inf)
    np.testing.assert_allclose(wild.pvalues, p)
    assert wild.inference == "wild WCR11 set+topic rademacher all 2^6"


def test_own_wild_bootstrap_equals_wildboottest_on_one_way_clusters():
    """wild_tests on one-way clusters reproduces wildboottest (all 2^G Rademacher vectors: no RNG involved)."""
    from posfair.stats.wild import _wildboottest_tests

    d = _reused(8, sets=7, topics=21, noise=0.2)
    X = position_design(d["position"].to_numpy(), 3)
    y = d["y"].to_numpy()
    st = cluster_structure(d["set"], d["topic"], "set")
    inf = Inference("wild", weights="rademacher", draws=999, clusters="set")
    t_own, p_own = wild_tests(X, y, st, inf)
    t_ref, p_ref = _wildboottest_tests(X, y, st.codes, inf)
    np.testing.assert_allclose(t_own, t_ref, rtol=1e-9)
    np.testing.assert_allclose(p_own, p_ref, atol=1e-12)
    assert 0.01 < p_own.max() < 1  # a test where the p-value is not at its floor
