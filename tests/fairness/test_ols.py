import numpy as np
import pytest
from scipy import stats

from posfair.fairness.ols import fit_position_ols, position_design, significance_mark


def _data(seed=0, n=4, sets=30, perms=6):
    rng = np.random.default_rng(seed)
    pos, y, cl = [], [], []
    for s in range(sets):
        u = rng.normal(0, 0.05)
        for _ in range(perms):
            for p in range(1, n + 1):
                pos.append(p)
                cl.append(f"set{s}")
                y.append(0.8 - 0.03 * (p - 1) + u + rng.normal(0, 0.02))
    return np.array(y), np.array(pos), np.array(cl)


def test_ols_against_direct_numpy():
    y, pos, cl = _data()
    n = 4
    fit = fit_position_ols(y, pos, cl, n=n)
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
    p = 2 * stats.norm.sf(np.abs(beta / se))
    np.testing.assert_allclose(fit.pvalues, p, rtol=1e-6, atol=1e-300)
    assert fit.n_clusters == G and fit.nobs == N
    # clustering matters here: the iid SEs are much smaller
    iid = np.sqrt(np.diag(bread) * (u @ u) / (N - K))
    assert se[0] > 2 * iid[0]


def test_design_matrix():
    X = position_design(np.array([1, 2, 3, 2]), 3)
    np.testing.assert_array_equal(X, [[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 0]])


@pytest.mark.parametrize(
    "p,mark",
    [(0.0, ""), (0.000999, ""), (0.001, "◊"), (0.0099, "◊"), (0.01, "□"), (0.0499, "□"), (0.05, "•"), (0.9, "•"), (float("nan"), "•")],
)
def test_significance_marks(p, mark):
    assert significance_mark(p) == mark


def test_marks_follow_pvalues():
    y, pos, cl = _data(n=3)
    fit = fit_position_ols(y, pos, cl)
    assert fit.marks == [significance_mark(p) for p in fit.pvalues]
    assert fit.names == ["beta_0", "beta_2", "beta_3"]
    frame = fit.to_frame()
    assert frame["estimate"].tolist() == fit.params.tolist()


def test_ols_errors():
    y, pos, cl = _data(n=3)
    with pytest.raises(ValueError, match="at least 2 segment sets"):
        fit_position_ols(y, pos, np.zeros(len(y)))
    with pytest.raises(ValueError, match="positions must cover"):
        fit_position_ols(y[pos < 3], pos[pos < 3], cl[pos < 3], n=3)
    bad = y.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        fit_position_ols(bad, pos, cl)
