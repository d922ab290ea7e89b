"""OLS on position dummies with cluster-robust standard errors.

``y = beta_0 + sum_{p=2..n} beta_p * 1{position = p} + e``; position 1 is the
baseline.  What is a cluster (:attr:`Inference.clusters`, see :mod:`posfair.fairness.clusters`):
``conservative`` (default: per coefficient the wider interval of two-way set+topic and
connected-component clustering, each at t(G-1) with its own G, and which one it used; the one-way
set clustering, said so, when no topic is in two sets), ``set+topic`` (two-way by segment set and
topic), ``set`` (the papers') or ``component``.
Two kinds of inference (:class:`Inference`):

``cluster`` (the default)
    CR1 cluster-robust covariance as in statsmodels ``cov_type="cluster"`` (small-sample
    correction ``G/(G-1) * (N-1)/(N-K)`` per clustering dimension) and p-values from Student's
    t with ``G - 1`` degrees of freedom (statsmodels ``use_t=True``), G = number of clusters
    (for two-way: the smaller of the set and topic counts; under ``conservative`` the G of the
    clustering each coefficient's interval used).  With few
    clusters the normal approximation is far too optimistic: a run whose n=4 instance rests
    on G = 2 sets gets p ~ 1e-272 from the normal and p ~ 0.02 from t(1) for the same t.

``wild``
    Wild cluster bootstrap-t (WCR11 in the terms of MacKinnon, Nielsen & Webb: null imposed,
    CR1 variance in every draw) computed with the ``wildboottest`` package, one test per
    coefficient (H0: beta = 0), bootstrap clusters = the clusters (one-way; under ``conservative``
    the clustering that coefficient's interval used).  Two-way
    (``set+topic``): the same WCR11 bootstrap computed here (:func:`wild_tests`), weights drawn
    per cluster of the dimension with fewer clusters and the two-way CR1 variance in every draw
    (MacKinnon, Nielsen and Webb 2021); on one-way clusters it reproduces wildboottest
    (tested under full enumeration).  Weights:

    * ``webb`` (default): Webb's six-point distribution, ``draws`` random draws from a
      generator seeded with ``seed`` (6^G distinct weight vectors, so few clusters still
      give a fine-grained bootstrap distribution);
    * ``rademacher``: +-1; when ``2^G < draws`` every one of the ``2^G`` sign vectors is
      enumerated (exact, the seed plays no part), as wildboottest does; otherwise
      ``draws`` seeded random draws.

    p-value: the share of bootstrap statistics with ``|t*| >= |t|`` (ties, up to a relative
    1e-9, count against the null).  Under full enumeration the share is over all ``2^G``
    vectors, which include the all-ones vector and its negation (``|t*| = |t|``), so
    ``p >= 2 / 2^G`` -- with G = 2 no p-value below 0.5 is possible, as it should be.
    With random draws the observed statistic counts as one of ``draws + 1``
    (``p = (1 + #{|t*| >= |t|}) / (draws + 1)``), so p is never 0.
    Standard errors and the statsmodels results object are those of the CR1 fit.

A fit on fewer than :data:`FEW_CLUSTERS` clusters emits a :class:`FewClustersWarning` naming G.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from wildboottest.wildboottest import WildboottestCL

from posfair.errors import PosfairInputError
from posfair.fairness.clusters import (
    CLUSTERINGS,
    DEFAULT_CLUSTERS,
    PSD_FIX_NOTE,
    ClusteredFit,
    ClusterStructure,
    cluster_kind,
    fit_clustered,
)

__all__ = [
    "PositionOLS",
    "fit_position_ols",
    "significance_mark",
    "MARKS",
    "MARK_LEGEND",
    "position_design",
    "Inference",
    "describe_inference",
    "INFERENCE_METHODS",
    "BOOTSTRAP_WEIGHTS",
    "FEW_CLUSTERS",
    "FewClustersWarning",
    "wild_pvalue",
    "wild_tests",
    "CLUSTERINGS",
]

log = logging.getLogger(__name__)

#: (upper p bound, mark): p < 0.001 is unmarked, as in the paper's tables.
MARKS: tuple[tuple[float, str], ...] = ((0.001, ""), (0.01, "◊"), (0.05, "□"))
NOT_SIGNIFICANT = "•"
MARK_LEGEND = "all values p < 0.001 unless marked: ◊ p < 0.01, □ p < 0.05, • not significant (p ≥ 0.05)"

INFERENCE_METHODS = ("cluster", "wild")
BOOTSTRAP_WEIGHTS = ("webb", "rademacher")
#: below this many clusters a fit warns: cluster-robust inference is unreliable with few clusters
FEW_CLUSTERS = 20
#: relative tolerance under which |t*| and |t| count as tied (ties count against the null)
TIE_RTOL = 1e-9


class FewClustersWarning(UserWarning):
    """A regression's p-values rest on fewer than :data:`FEW_CLUSTERS` clusters."""


def significance_mark(p: float) -> str:
    """The paper's mark for a p-value: '' (p<0.001), '◊' (<0.01), '□' (<0.05), '•' (n.s.)."""
    if p is None or not np.isfinite(p):
        return NOT_SIGNIFICANT
    for bound, mark in MARKS:
        if p < bound:
            return mark
    return NOT_SIGNIFICANT


@dataclass(frozen=True)
class Inference:
    """How p-values are computed (see the module docstring).

    Args:
        method: ``"cluster"`` (CR1 + t(G-1)) or ``"wild"`` (wild cluster bootstrap).
        draws: bootstrap draws B (wild only).
        weights: ``"webb"`` or ``"rademacher"`` (wild only; Rademacher enumerates all 2^G
            sign vectors when 2^G < draws).
        seed: seed of the bootstrap weights (wild only).
        clusters: what is a cluster: ``"conservative"`` (the default: per coefficient the wider of two-way
            and component clustering), ``"set+topic"`` (two-way), ``"set"`` (the papers') or ``"component"``
            (see :mod:`posfair.fairness.clusters`).
    """

    method: str = "cluster"
    draws: int = 9999
    weights: str = "webb"
    seed: int = 0
    clusters: str = DEFAULT_CLUSTERS

    def __post_init__(self) -> None:
        method = str(self.method).strip().lower()
        if method not in INFERENCE_METHODS:
            raise PosfairInputError(f"inference must be one of {', '.join(INFERENCE_METHODS)}; got {self.method!r}")
        object.__setattr__(self, "method", method)
        weights = str(self.weights).strip().lower()
        if weights not in BOOTSTRAP_WEIGHTS:
            raise PosfairInputError(
                f"bootstrap weights must be one of {', '.join(BOOTSTRAP_WEIGHTS)}; got {self.weights!r}"
            )
        object.__setattr__(self, "weights", weights)
        if isinstance(self.draws, bool) or int(self.draws) != self.draws or self.draws < 99:
            raise PosfairInputError(f"bootstrap draws must be an integer >= 99; got {self.draws!r}")
        object.__setattr__(self, "draws", int(self.draws))
        if isinstance(self.seed, bool) or int(self.seed) != self.seed or self.seed < 0:
            raise PosfairInputError(f"bootstrap seed must be an integer >= 0; got {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))
        clusters = str(self.clusters).strip().lower()
        if clusters not in CLUSTERINGS:
            raise PosfairInputError(f"clusters must be one of {', '.join(CLUSTERINGS)}; got {self.clusters!r}")
        object.__setattr__(self, "clusters", clusters)

    @classmethod
    def coerce(cls, value: Inference | str | dict | None) -> Inference:
        if value is None:
            return cls()
        if isinstance(value, Inference):
            return value
        if isinstance(value, dict):
            return cls(**value)
        return cls(method=str(value))

    def enumerates(self, n_clusters: int) -> bool:
        """Whether the wild bootstrap enumerates all 2^G Rademacher vectors (as wildboottest does)."""
        return self.method == "wild" and self.weights == "rademacher" and 2**n_clusters < self.draws

    def label(self, n_clusters: int | None = None) -> str:
        """Short label for tables: ``CR1 set+topic t(G-1)`` or ``wild WCR11 set webb B=9999 seed=0`` (or ``... all 2^G``).

        ``n_clusters``: the bootstrap's cluster count (decides whether Rademacher weights are enumerated).
        """
        if self.method == "cluster":
            return f"CR1 {self.clusters} t(G-1)"
        if n_clusters is not None and self.enumerates(n_clusters):
            return f"wild WCR11 {self.clusters} rademacher all 2^{n_clusters}"
        return f"wild WCR11 {self.clusters} {self.weights} B={self.draws} seed={self.seed}"

    def describe(self) -> str:
        """A sentence for captions and reports."""
        return describe_inference([self.label()])

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "draws": self.draws,
            "weights": self.weights,
            "seed": self.seed,
            "clusters": self.clusters,
        }


#: what each clustering means, in words (captions)
CLUSTERS_IN_WORDS = {
    "conservative": (
        "per coefficient the wider interval of two-way clustering by segment set and topic and clustering by "
        "connected component of segment sets sharing a topic, each with its own G; which one, and its G, per "
        "coefficient (cluster_by); where no topic is in two sets both are the segment sets"
    ),
    "set+topic": "two-way clusters by segment set and topic (Cameron, Gelbach and Miller; G = the smaller count)",
    "set": "clusters = segment sets",
    "component": "clusters = connected components of segment sets sharing a topic",
}


def _label_clusters(label: str, prefix: str) -> str | None:
    rest = label.removeprefix(prefix).split(" ", 1)[0]
    return rest if rest in CLUSTERINGS else None


def describe_inference(labels) -> str:
    """A sentence for captions from the short labels of :meth:`Inference.label` found in a table."""
    labels = list(dict.fromkeys(str(x) for x in labels))
    parts = []
    for lab in labels:
        if lab == "CR1 t(G-1)":  # a run saved before clusters were named
            lab = "CR1 set t(G-1)"
        if lab.startswith("CR1 ") and (by := _label_clusters(lab, "CR1 ")):
            parts.append(
                f"CR1 cluster-robust standard errors ({CLUSTERS_IN_WORDS[by]}; correction G/(G-1) * (N-1)/(N-K) per "
                "dimension), p-values from Student's t with G-1 degrees of freedom"
            )
        elif lab.startswith("wild WCR11 "):
            by = _label_clusters(lab, "wild WCR11 ") or "set"
            rest = lab.removeprefix("wild WCR11 ").removeprefix(f"{by} ")
            parts.append(
                "CR1 cluster-robust standard errors; p-values from a wild cluster bootstrap-t (WCR11: null imposed, CR1 "
                f"variance in every draw, {CLUSTERS_IN_WORDS[by]}; weights per cluster"
                + (" of the dimension with fewer clusters" if by == "set+topic" else "")
                + f"; {rest}; p = share of |t*| ≥ |t| with the observed statistic counted as one draw, or over all "
                "2^G Rademacher sign vectors where enumerated)"
            )
        else:
            parts.append(lab)
    return "; ".join(dict.fromkeys(parts))


@dataclass(frozen=True)
class PositionOLS:
    """Coefficients beta_0 (intercept = mean at position 1) and beta_2..beta_n.

    ``result`` is statsmodels' results object of the CR1 fit (``conf_int()``, ``summary()``,
    ``cov_params()``, ...: intervals and tests from t(G-1)); with wild inference ``pvalues`` are
    the bootstrap ones, and the results object's are still those of t(G-1).
    """

    n: int
    params: np.ndarray  # (n,): beta_0, beta_2, ..., beta_n
    bse: np.ndarray
    pvalues: np.ndarray
    nobs: int
    n_clusters: int
    tvalues: np.ndarray | None = None
    inference: str = "CR1 conservative t(G-1)"
    cluster_by: str = ""  # e.g. "set+topic (90 sets, 53 topics)"
    result: Any = field(default=None, compare=False, repr=False)
    fit: ClusteredFit | None = field(default=None, compare=False, repr=False)
    inference_each: tuple[str, ...] | None = None  # per coefficient, where the bootstraps' clusters differ

    @property
    def G(self) -> np.ndarray:
        """Per coefficient the clusters its interval and p-value rest on."""
        return self.fit.G if self.fit is not None else np.full(self.n, self.n_clusters)

    @property
    def clusters_used(self) -> list[str]:
        """Per coefficient what a cluster is in its interval, with the counts (e.g. ``components (5 of 8 sets ...)``)."""
        return list(self.fit.clusters) if self.fit is not None else [self.cluster_by] * self.n

    @property
    def names(self) -> list[str]:
        return ["beta_0"] + [f"beta_{p}" for p in range(2, self.n + 1)]

    @property
    def marks(self) -> list[str]:
        return [significance_mark(p) for p in self.pvalues]

    def conf_int(self, alpha: float = 0.05) -> np.ndarray:
        """CR1 confidence intervals from t(G-1), shape (n, 2): statsmodels' under one clustering; under
        ``conservative`` each coefficient's under the clustering its interval used (its own G)."""
        if self.fit is not None:
            return self.fit.conf_int(alpha)
        return np.asarray(self.result.conf_int(alpha))

    def summary(self, alpha: float = 0.05):
        """statsmodels' summary of the CR1 fit, the coefficients named ``beta_0, beta_2, ...``.

        Its p-values are those of t(G-1) also under wild inference (see :attr:`pvalues`).  Under ``conservative`` it
        is the fit of the clustering most coefficients used, and a note names every coefficient whose interval used
        the other (its numbers are in :attr:`bse`, :attr:`pvalues`, :meth:`conf_int`).
        """
        out = self.result.summary(xname=self.names, alpha=alpha)
        notes = self.fit.notes(self.names) if self.fit is not None else []
        if notes:
            out.add_extra_txt(notes)
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per coefficient; ``ci_low`` / ``ci_high``: the 95% interval of :meth:`conf_int`."""
        ci = self.conf_int() if self.result is not None or self.fit is not None else np.full((self.n, 2), np.nan)
        return pd.DataFrame(
            {
                "coef": self.names,
                "position": [1] + list(range(2, self.n + 1)),
                "estimate": self.params,
                "se": self.bse,
                "t": self.tvalues if self.tvalues is not None else np.full(self.n, np.nan),
                "p": self.pvalues,
                "mark": self.marks,
                "nobs": self.nobs,
                "clusters": self.G,
                "cluster_by": self.clusters_used,
                "inference": list(self.inference_each) if self.inference_each else self.inference,
                "ci_low": ci[:, 0],
                "ci_high": ci[:, 1],
            }
        )


def position_design(positions: np.ndarray, n: int) -> np.ndarray:
    """Design matrix: intercept + dummies for positions 2..n (positions are 1-based)."""
    positions = np.asarray(positions)
    X = np.zeros((len(positions), n), dtype=np.float64)
    X[:, 0] = 1.0
    for p in range(2, n + 1):
        X[:, p - 1] = positions == p
    return X


def few_clusters_text(n_clusters: int) -> str:
    return (
        f"the positional regression rests on G = {n_clusters} clusters, fewer than {FEW_CLUSTERS}: "
        "cluster-robust p-values are approximate; raise the document count (more segment sets) or use the wild "
        "cluster bootstrap (--inference wild)"
    )


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


def fit_position_ols(
    y,
    positions,
    clusters,
    n: int | None = None,
    inference: Inference | str | None = None,
    *,
    topics=None,
    warn: bool = True,
) -> PositionOLS:
    """Fit the positional OLS with cluster-robust SEs.

    ``clusters``: the segment-set id of every observation; ``topics``: its topic (corpus id), needed
    for ``inference.clusters`` ``"conservative"`` (the default), ``"set+topic"`` and ``"component"``.
    ``inference``: :class:`Inference` (or ``"cluster"`` / ``"wild"``); default CR1 + t(G-1), per coefficient
    the wider of two-way and component clustering (:func:`posfair.fairness.clusters.fit_clustered`).
    ``warn``: emit a :class:`FewClustersWarning` when G < :data:`FEW_CLUSTERS` (callers that fit
    many regressions warn once for all of them instead).
    """
    inference = Inference.coerce(inference)
    y = np.asarray(y, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.int64)
    if n is None:
        n = int(positions.max())
    if len(y) != len(positions) or len(y) != len(clusters) or (topics is not None and len(topics) != len(y)):
        raise ValueError("y, positions, clusters (and topics) must have the same length")
    if not np.isfinite(y).all():
        raise ValueError(f"{int((~np.isfinite(y)).sum())} non-finite observations in the regression")
    present = set(np.unique(positions).tolist())
    if present != set(range(1, n + 1)):
        raise ValueError(f"positions must cover 1..{n}; got {sorted(present)}")
    # cluster codes in sorted order of the ids (as wildboottest orders them): bootstrap weights go to
    # clusters by id, so the p-values do not depend on the row order of the observations
    X = position_design(positions, n)
    fit = fit_clustered(y, X, clusters, topics, inference.clusters)
    n_clusters = fit.n_clusters
    if warn and n_clusters < FEW_CLUSTERS:
        warnings.warn(few_clusters_text(n_clusters), FewClustersWarning, stacklevel=2)
    tvalues, pvalues = fit.tvalues, fit.pvalues.copy()
    labels_each = [inference.label(int(fit.structures[u].bootstrap_codes.max()) + 1) for u in fit.used]
    if inference.method == "wild":
        # per coefficient the bootstrap of the clustering its interval used
        for used in dict.fromkeys(fit.used):
            structure = fit.structures[used]
            pick = np.array([u == used for u in fit.used])
            if structure.codes.ndim == 1:
                t_wild, p_wild = _wildboottest_tests(X, y, structure.codes, inference)
            else:
                t_wild, p_wild = wild_tests(X, y, structure, inference)
            # (after the eigenvalue fix of a two-way covariance the fit's t differ from the raw ones the bootstrap uses)
            fixed = any(PSD_FIX_NOTE in c for c, u in zip(fit.clusters, fit.used, strict=True) if u == used)
            if not fixed and not np.allclose(t_wild[pick], tvalues[pick], rtol=1e-6, atol=1e-9):
                raise RuntimeError(f"wild bootstrap t statistics {t_wild} differ from the CR1 fit's {tvalues}")
            pvalues[pick] = p_wild[pick]
            log.debug("wild bootstrap (%s, %s): p=%s", inference.label(), used, p_wild)
    labels = list(dict.fromkeys(fit.clusters))
    return PositionOLS(
        n=n,
        params=fit.params,
        bse=fit.bse,
        pvalues=np.asarray(pvalues),
        nobs=len(y),
        n_clusters=n_clusters,
        tvalues=tvalues,
        inference="; ".join(dict.fromkeys(labels_each)),
        inference_each=tuple(labels_each) if len(set(labels_each)) > 1 else None,
        cluster_by=labels[0] if len(labels) == 1 else "; ".join(f"{cluster_kind(c)}: {c}" for c in labels),
        result=fit.result,
        fit=fit,
    )
