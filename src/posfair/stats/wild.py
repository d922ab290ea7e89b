"""The wild cluster bootstrap-t (WCR11) of :class:`~posfair.stats.inference.Inference` ``method="wild"``.

One test per coefficient (H0: beta = 0), null imposed, CR1 variance in every draw: one-way clusters through
the ``wildboottest`` package (:func:`_wildboottest_tests`), any :class:`~posfair.stats.clusters.ClusterStructure`
(two-way ``set+topic`` included) computed here (:func:`wild_tests`); p-values by :func:`wild_pvalue`.  See
:mod:`posfair.stats.inference` for the weights and the p-value rule.
"""

from __future__ import annotations

import numpy as np
from wildboottest.wildboottest import WildboottestCL

from posfair.stats.clusters import ClusterStructure
from posfair.stats.inference import Inference

__all__ = ["wild_pvalue", "wild_tests", "TIE_RTOL"]

#: relative tolerance under which |t*| and |t| count as tied (ties count against the null)
TIE_RTOL = 1e-9


def wild_pvalue(t_stat: float, t_boot: np.ndarray, *, enumerated: bool) -> float:
    """Symmetric bootstrap p-value: share of ``|t*| >= |t|`` (ties up to :data:`TIE_RTOL` included).

    ``enumerated``: ``t_boot`` holds the statistic of every weight vector (full enumeration);
    otherwise ``t_boot`` are random draws and the observed statistic counts as one more draw.
    Non-finite bootstrap statistics are dropped.
    """
    t_boot = np.asarray(t_boot, dtype=np.float64).ravel()
    t_boot = t_boot[np.isfinite(t_boot)]
    t = abs(float(t_stat))
    if not np.isfinite(t) or not len(t_boot):
        return float("nan")
    exceed = int(np.sum(np.abs(t_boot) >= t * (1 - TIE_RTOL)))
    if enumerated:
        return exceed / len(t_boot)
    return (1 + exceed) / (len(t_boot) + 1)


def _wildboottest_tests(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, inference: Inference
) -> tuple[np.ndarray, np.ndarray]:
    """(t statistics, bootstrap p-values) per coefficient via wildboottest's WCR11 bootstrap (one-way clusters)."""
    k = X.shape[1]
    G = int(len(np.unique(groups)))
    enumerated = inference.enumerates(G)
    tvals, pvals = np.empty(k), np.empty(k)
    for j in range(k):
        R = np.zeros(k)
        R[j] = 1.0
        wb = WildboottestCL(X=X, Y=y, cluster=groups, R=R, B=inference.draws, seed=inference.seed, parallel=False)
        wb.get_scores(bootstrap_type="11", impose_null=True, adj=True, cluster_adj=True)
        wb.get_weights(weights_type=inference.weights)
        wb.get_numer()
        wb.get_denom()
        wb.get_tboot()
        wb.get_vcov()
        wb.get_tstat()
        tvals[j] = float(np.asarray(wb.t_stat).ravel()[0])
        pvals[j] = wild_pvalue(tvals[j], wb.t_boot, enumerated=enumerated)
    return tvals, pvals


#: Webb's six-point distribution
_WEBB = np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)])


def _bootstrap_weights(G: int, inference: Inference) -> np.ndarray:
    """(G, B) weights: every Rademacher sign vector when enumerated, else ``draws`` seeded draws."""
    if inference.enumerates(G):
        return 1.0 - 2.0 * ((np.arange(2**G)[None, :] >> np.arange(G)[:, None]) & 1)
    rng = np.random.default_rng(inference.seed)
    if inference.weights == "rademacher":
        return rng.choice([-1.0, 1.0], size=(G, inference.draws))
    return rng.choice(_WEBB, size=(G, inference.draws))


def _cluster_variance(S: np.ndarray, structure: ClusterStructure, nobs: int, k: int) -> np.ndarray:
    """Per column of ``S`` (N, B) (one coefficient's scores ``a_i * u_i``), the CR1 variance of ``structure``:
    sum over the covariance terms of ``sign * G/(G-1) * (N-1)/(N-K) * sum_g (sum_{i in g} S_i)^2``."""
    var = np.zeros(S.shape[1])
    for codes, sign in structure.variance_dimensions():
        G = int(codes.max()) + 1
        sums = np.zeros((G, S.shape[1]))
        np.add.at(sums, codes, S)
        var += sign * G / (G - 1) * (nobs - 1) / (nobs - k) * np.sum(sums**2, axis=0)
    return var


def wild_tests(
    X: np.ndarray, y: np.ndarray, structure: ClusterStructure, inference: Inference, *, chunk: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """(t statistics, WCR11 bootstrap p-values) per coefficient for any :class:`ClusterStructure`.

    For each coefficient j: the restricted fit (beta_j = 0) gives fitted values and residuals u;
    each draw b sets ``y* = X beta_r + v_g(i),b * u_i`` with weights ``v`` per bootstrap cluster
    (:attr:`ClusterStructure.bootstrap_codes`), refits, and takes ``t* = beta*_j / se*_j`` with
    the structure's CR1 variance.  The observed t uses the same variance on the unrestricted fit.
    """
    n_obs, k = X.shape
    A = np.linalg.inv(X.T @ X)
    beta = A @ X.T @ y
    boot = structure.bootstrap_codes
    V = _bootstrap_weights(int(boot.max()) + 1, inference)
    enumerated = inference.enumerates(int(boot.max()) + 1)
    tvals, pvals = np.empty(k), np.empty(k)
    for j in range(k):
        a = X @ A[j]  # beta_j = a . y
        u_hat = y - X @ beta
        tvals[j] = beta[j] / np.sqrt(_cluster_variance((a * u_hat)[:, None], structure, n_obs, k)[0])
        keep = [c for c in range(k) if c != j]
        Xr = X[:, keep]
        fitted_r = Xr @ np.linalg.lstsq(Xr, y, rcond=None)[0]
        u_r = y - fitted_r
        t_boot = []
        for lo in range(0, V.shape[1], chunk):
            Y = fitted_r[:, None] + u_r[:, None] * V[boot, lo : lo + chunk]
            B = A @ (X.T @ Y)
            U = Y - X @ B
            t_boot.append(B[j] / np.sqrt(_cluster_variance(a[:, None] * U, structure, n_obs, k)))
        pvals[j] = wild_pvalue(tvals[j], np.concatenate(t_boot), enumerated=enumerated)
    return tvals, pvals
