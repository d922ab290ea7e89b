import itertools
import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from posfair.stats.inference import FEW_CLUSTERS, FewClustersWarning, Inference, significance_mark
from posfair.stats.position_ols import fit_position_ols, position_design


def _data(seed=0, n=4, sets=30, perms=6, slope=0.03, noise=0.02):
    """Observations of ``sets`` segment sets with ``n`` topics each, no topic in two sets (so clustering by
    set+topic is exactly clustering by set): y, positions, set ids, topics."""
    rng = np.random.default_rng(seed)
    pos, y, cl, tp = [], [], [], []
    for s in range(sets):
        u = rng.normal(0, 0.05)
        for j in range(perms):
            for p in range(1, n + 1):
                pos.append(p)
                cl.append(f"set{s}")
                tp.append(f"set{s}-topic{(p - 1 + j) % n}")
                y.append(0.8 - slope * (p - 1) + u + rng.normal(0, noise))
    return np.array(y), np.array(pos), np.array(cl), np.array(tp)


def _quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)
        return fit_position_ols(*args, **kwargs)


def test_ols_against_direct_numpy():
    y, pos, cl, tp = _data()
    n = 4
    fit = fit_position_ols(y, pos, cl, topics=tp, n=n)
    # direct: dummies by hand
    X = np.column_stack([np.ones(len(y))] + [(pos == p).astype(float) for p in range(2, n + 1)])
    beta = np.linalg.solve(X.T @ X, X.T @ y)
    np.testing.assert_allclose(fit.params, beta, rtol=1e-10, atol=1e-12)
    # beta_0 is the mean at position 1, beta_p the difference of means
    np.testing.assert_allclose(beta[0], y[pos == 1].mean())
    for p in range(2, n + 1):
        np.testing.assert_allclose(beta[p - 1], y[pos == p].mean() - y[pos == 1].mean(), atol=1e-12)
    # cluster-robust sandwich with the small-sample correction G/(G-1) * (N-1)/(N-K)
    u = y - X @ beta
    bread = np.linalg.inv(X.T @ X)
    groups = sorted(set(cl))
    meat = np.zeros((n, n))
    for g in groups:
        m = cl == g
        s = X[m].T @ u[m]
        meat += np.outer(s, s)
    N, K, G = len(y), n, len(groups)
    V = G / (G - 1) * (N - 1) / (N - K) * bread @ meat @ bread
    se = np.sqrt(np.diag(V))
    np.testing.assert_allclose(fit.bse, se, rtol=1e-8)
    # p-values from Student's t with G - 1 degrees of freedom
    p = 2 * stats.t.sf(np.abs(beta / se), df=G - 1)
    np.testing.assert_allclose(fit.pvalues, p, rtol=1e-6, atol=1e-300)
    np.testing.assert_allclose(fit.tvalues, beta / se, rtol=1e-8)
    assert fit.n_clusters == G and fit.nobs == N
    # clustering matters here: the iid SEs are much smaller
    iid = np.sqrt(np.diag(bread) * (u @ u) / (N - K))
    assert se[0] > 2 * iid[0]


@pytest.mark.parametrize("sets", [2, 6, 30])
def test_cluster_inference_equals_statsmodels(sets):
    """CR1 + t(G-1) (set+topic asked for), against statsmodels called directly (cov_type='cluster', use_t=True)."""
    y, pos, cl, tp = _data(seed=sets, sets=sets, perms=24)
    fit = _quiet(y, pos, cl, topics=tp, n=4, inference=Inference(clusters="set+topic"))
    X = pd.DataFrame({"const": 1.0, **{f"pos{p}": (pos == p).astype(float) for p in range(2, 5)}})
    codes = pd.Series(cl).astype("category").cat.codes.to_numpy()
    ref = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    assert ref.df_resid_inference == sets - 1
    np.testing.assert_allclose(fit.params, ref.params.to_numpy(), rtol=1e-10)
    np.testing.assert_allclose(fit.bse, ref.bse.to_numpy(), rtol=1e-10)
    np.testing.assert_allclose(fit.pvalues, ref.pvalues.to_numpy(), rtol=1e-8, atol=1e-300)
    np.testing.assert_allclose(
        fit.pvalues, 2 * stats.t.sf(np.abs(ref.tvalues.to_numpy()), df=sets - 1), rtol=1e-8, atol=1e-300
    )
    np.testing.assert_allclose(fit.conf_int(), ref.conf_int().to_numpy(), rtol=1e-10)
    assert fit.n_clusters == sets and fit.inference == "CR1 set+topic t(G-1)"
    frame = fit.to_frame()
    assert (frame["clusters"] == sets).all() and (frame["inference"] == "CR1 set+topic t(G-1)").all()
    assert "coef" in fit.result.summary().as_text()


def test_few_clusters_warning_names_g():
    y, pos, cl, tp = _data(sets=6)
    with pytest.warns(FewClustersWarning, match=r"G = 6 clusters, fewer than 20"):
        fit_position_ols(y, pos, cl, topics=tp)
    y, pos, cl, tp = _data(sets=FEW_CLUSTERS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_position_ols(y, pos, cl, topics=tp).n_clusters == FEW_CLUSTERS
    y, pos, cl, tp = _data(sets=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_position_ols(y, pos, cl, topics=tp, warn=False)


def test_two_clusters_are_not_absurdly_significant():
    """The `--docs 48` case: n=4 on 2 segment sets (24 orderings each), a clear positional effect."""
    y, pos, cl, tp = _data(seed=3, sets=2, perms=24, slope=0.03, noise=0.002)
    fit = _quiet(y, pos, cl, topics=tp, n=4, inference=Inference(clusters="set+topic"))
    t = fit.tvalues[1:]
    normal = 2 * stats.norm.sf(np.abs(t))
    assert normal.max() < 1e-50  # what the normal approximation claimed
    np.testing.assert_allclose(fit.pvalues[1:], 2 * stats.t.sf(np.abs(t), df=1), rtol=1e-8)
    assert fit.pvalues[1:].min() > 1e-4  # t(1): p ~ 0.64 / |t|, not exp(-t^2 / 2)
    rad = _quiet(
        y, pos, cl, topics=tp, n=4, inference=Inference("wild", clusters="set+topic", draws=999, weights="rademacher")
    )
    assert rad.inference == "wild WCR11 set+topic rademacher all 2^2"
    assert (rad.pvalues >= 0.5).all()  # 4 sign vectors, two of them tie with the sample
    webb = _quiet(
        y, pos, cl, topics=tp, n=4, inference=Inference("wild", clusters="set+topic", draws=999, weights="webb", seed=1)
    )
    assert (webb.pvalues > 0.05).all()


# -- the wild cluster bootstrap against a hand-written WCR11 -------------------------------

WEBB = np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)])


def _wcr11_t(X, y, groups, j, V):
    """Bootstrap t statistics of coefficient j for weight matrix V (G x B): null beta_j = 0 imposed, CR1 variance."""
    N, K = X.shape
    G = V.shape[0]
    XtXi = np.linalg.inv(X.T @ X)
    Xr = np.delete(X, j, axis=1)
    fitted = Xr @ np.linalg.lstsq(Xr, y, rcond=None)[0]
    resid = y - fitted
    ystar = fitted[:, None] + resid[:, None] * V[groups, :]
    bstar = XtXi @ X.T @ ystar
    ustar = ystar - X @ bstar
    a = np.stack([XtXi[j] @ (X[groups == g].T @ ustar[groups == g]) for g in range(G)])
    var = G / (G - 1) * (N - 1) / (N - K) * (a**2).sum(axis=0)
    return bstar[j] / np.sqrt(var)


def _t_observed(X, y, groups, j):
    """The CR1 t statistic of coefficient j computed directly."""
    N, K = X.shape
    G = int(groups.max()) + 1
    XtXi = np.linalg.inv(X.T @ X)
    b = XtXi @ X.T @ y
    u = y - X @ b
    a = np.array([XtXi[j] @ (X[groups == g].T @ u[groups == g]) for g in range(G)])
    return b[j] / np.sqrt(G / (G - 1) * (N - 1) / (N - K) * (a**2).sum())


def _reference_pvalues(y, pos, cl, n, weights, draws, seed):
    X = position_design(pos, n)
    groups = pd.Series(cl).astype("category").cat.codes.to_numpy().astype(np.int64)
    G = int(groups.max()) + 1
    out = []
    for j in range(n):
        if weights == "rademacher" and 2**G < draws:  # every sign vector once: exact
            V = np.array(list(itertools.product([-1.0, 1.0], repeat=G))).T
            tb = _wcr11_t(X, y, groups, j, V)
            t = _t_observed(X, y, groups, j)
            out.append(np.mean(np.abs(tb) >= abs(t) * (1 - 1e-9)))
        else:  # seeded draws, generated as wildboottest does: one generator, G*B choices, row-major G x B
            rng = np.random.default_rng(seed)
            values = WEBB if weights == "webb" else np.array([-1.0, 1.0])
            V = rng.choice(values, size=G * draws, replace=True).reshape(G, draws)
            tb = _wcr11_t(X, y, groups, j, V)
            t = _t_observed(X, y, groups, j)
            out.append((1 + np.sum(np.abs(tb) >= abs(t) * (1 - 1e-9))) / (draws + 1))
    return np.array(out)


@pytest.mark.parametrize(
    "sets,weights,draws,seed",
    [
        (6, "webb", 999, 0),
        (6, "rademacher", 999, 0),
        (12, "webb", 499, 7),
        (12, "rademacher", 999, 3),
        (3, "webb", 999, 5),
    ],
)
def test_wild_bootstrap_against_hand_written(sets, weights, draws, seed):
    y, pos, cl, tp = _data(seed=sets, sets=sets, perms=6, slope=0.004)
    inf = Inference("wild", clusters="set+topic", draws=draws, weights=weights, seed=seed)
    fit = _quiet(y, pos, cl, topics=tp, n=4, inference=inf)
    ref = _reference_pvalues(y, pos, cl, 4, weights, draws, seed)
    np.testing.assert_allclose(fit.pvalues, ref, rtol=0, atol=1e-12)
    # SEs and t stay those of the CR1 fit; the label says what was done
    assert fit.n_clusters == sets
    assert fit.inference == (
        f"wild WCR11 set+topic rademacher all 2^{sets}"
        if weights == "rademacher" and 2**sets < draws
        else f"wild WCR11 set+topic {weights} B={draws} seed={seed}"
    )
    default = _quiet(y, pos, cl, topics=tp, n=4)
    np.testing.assert_allclose(fit.bse, default.bse)
    np.testing.assert_allclose(fit.tvalues, default.tvalues)


def test_wild_bootstrap_against_wildboottest_api():
    """wildboottest's own statsmodels entry point counts |t*| > |t| over the B draws; ours adds the sample as a draw."""
    from wildboottest.wildboottest import wildboottest

    y, pos, cl, tp = _data(seed=4, sets=25, perms=6, slope=0.003)
    B, seed = 999, 11
    fit = _quiet(
        y,
        pos,
        cl,
        topics=tp,
        n=4,
        inference=Inference("wild", clusters="set+topic", draws=B, weights="webb", seed=seed),
    )
    X = pd.DataFrame({"const": 1.0, **{f"pos{p}": (pos == p).astype(float) for p in range(2, 5)}})
    codes = pd.Series(cl).astype("category").cat.codes.to_numpy()
    for j, name in enumerate(X.columns):
        res = wildboottest(
            sm.OLS(y, X), B=B, cluster=codes, param=name, weights_type="webb", seed=seed, show=False, parallel=False
        )
        theirs = float(res["p-value"].iloc[0])
        np.testing.assert_allclose(float(np.ravel(res["statistic"].iloc[0])[0]), fit.tvalues[j], rtol=1e-8)
        # no ties with 25 clusters and Webb weights: (1 + #{|t*| >= |t|}) / (B + 1) == (1 + B * p_theirs) / (B + 1)
        assert fit.pvalues[j] == pytest.approx((1 + round(theirs * B)) / (B + 1), abs=1e-12)


def test_wild_bootstrap_is_seeded():
    y, pos, cl, tp = _data(seed=1, sets=8, perms=6, slope=0.004)
    a = _quiet(y, pos, cl, topics=tp, n=4, inference=Inference("wild", clusters="set+topic", draws=499, seed=3))
    b = _quiet(y, pos, cl, topics=tp, n=4, inference=Inference("wild", clusters="set+topic", draws=499, seed=3))
    c = _quiet(y, pos, cl, topics=tp, n=4, inference=Inference("wild", clusters="set+topic", draws=499, seed=4))
    np.testing.assert_array_equal(a.pvalues, b.pvalues)
    assert not np.array_equal(a.pvalues, c.pvalues)
    # weights go to segment sets by id: the row order of the observations does not matter
    order = np.random.default_rng(0).permutation(len(y))
    d = _quiet(
        y[order],
        pos[order],
        cl[order],
        topics=tp[order],
        n=4,
        inference=Inference("wild", clusters="set+topic", draws=499, seed=3),
    )
    np.testing.assert_array_equal(a.pvalues, d.pvalues)


def test_inference_validation():
    assert Inference.coerce(None) == Inference("cluster")
    assert Inference.coerce("WILD").method == "wild"
    with pytest.raises(ValueError, match="inference must be one of cluster, wild; got 'bogus'"):
        Inference("bogus")
    with pytest.raises(ValueError, match="weights must be one of webb, rademacher"):
        Inference("wild", clusters="set+topic", weights="mammen")
    with pytest.raises(ValueError, match="draws must be an integer >= 99"):
        Inference("wild", clusters="set+topic", draws=10)
    with pytest.raises(ValueError, match="seed"):
        Inference("wild", clusters="set+topic", seed=-1)


def test_design_matrix():
    X = position_design(np.array([1, 2, 3, 2]), 3)
    np.testing.assert_array_equal(X, [[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    "p,mark",
    [
        (0.0, ""),
        (0.000999, ""),
        (0.001, "◊"),
        (0.0099, "◊"),
        (0.01, "□"),
        (0.0499, "□"),
        (0.05, "•"),
        (0.9, "•"),
        (float("nan"), "•"),
    ],
)
def test_significance_marks(p, mark):
    assert significance_mark(p) == mark


def test_marks_follow_pvalues():
    y, pos, cl, tp = _data(n=3)
    fit = fit_position_ols(y, pos, cl, topics=tp)
    assert fit.marks == [significance_mark(p) for p in fit.pvalues]
    assert fit.names == ["beta_0", "beta_2", "beta_3"]
    frame = fit.to_frame()
    assert frame["estimate"].tolist() == fit.params.tolist()
    assert frame["mark"].tolist() == [significance_mark(p) for p in frame["p"]]


def test_ols_errors():
    y, pos, cl, tp = _data(n=3)
    with pytest.raises(ValueError, match="at least 2 clusters"):
        fit_position_ols(y, pos, np.zeros(len(y)), topics=tp)
    with pytest.raises(ValueError, match="set\\+topic needs the topic of every observation"):
        fit_position_ols(y, pos, cl, inference=Inference(clusters="set+topic"))
    with pytest.raises(ValueError, match="clustering 'conservative' needs the topic of every observation"):
        fit_position_ols(y, pos, cl)
    with pytest.raises(ValueError, match="positions must cover"):
        fit_position_ols(y[pos < 3], pos[pos < 3], cl[pos < 3], topics=tp[pos < 3], n=3)
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        fit_position_ols(bad, pos, cl)


@pytest.mark.parametrize(
    "inference",
    [Inference(clusters="set+topic"), Inference("wild", clusters="set+topic", draws=199, weights="webb", seed=1)],
)
def test_results_object_summary_and_ci_columns(inference):
    """statsmodels' results object stays reachable: summary() and conf_int() work, and conf_int is the CI columns."""
    y, pos, cl, tp = _data(seed=3, sets=8)
    fit = _quiet(y, pos, cl, topics=tp, n=4, inference=inference)
    text = fit.summary().as_text()
    assert all(name in text for name in ("beta_0", "beta_2", "beta_3", "beta_4")) and "cluster" in text
    assert "coef" in fit.result.summary().as_text()
    frame = fit.to_frame()
    np.testing.assert_array_equal(frame[["ci_low", "ci_high"]].to_numpy(), fit.conf_int())
    np.testing.assert_array_equal(fit.conf_int(), np.asarray(fit.result.conf_int(0.05)))
    np.testing.assert_array_equal(frame["estimate"].to_numpy(), fit.result.params)
    # the interval is t(G-1) around the CR1 SE, whatever the p-values rest on
    half = stats.t.ppf(0.975, df=7) * fit.bse
    np.testing.assert_allclose(fit.conf_int(), np.column_stack([fit.params - half, fit.params + half]), rtol=1e-10)
