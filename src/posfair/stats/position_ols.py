"""OLS on position dummies with cluster-robust standard errors.

``y = beta_0 + sum_{p=2..n} beta_p * 1{position = p} + e``; position 1 is the
baseline.  What is a cluster (:attr:`Inference.clusters`, see :mod:`posfair.stats.clusters`):
``conservative`` (default: per coefficient the wider interval of two-way set+topic and
connected-component clustering, each at t(G-1) with its own G, and which one it used; the one-way
set clustering, said so, when no topic is in two sets), ``set+topic`` (two-way by segment set and
topic), ``set`` (the papers') or ``component``.
How p-values are computed: :class:`~posfair.stats.inference.Inference` (CR1 + t(G-1), or the wild cluster
bootstrap of :mod:`posfair.stats.wild`).

"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from statsmodels.iolib.summary import summary_params

from posfair.runtime.stacklevel import user_stacklevel
from posfair.stats.clusters import PSD_FIX_NOTE, ClusteredFit, cluster_kind, fit_clustered
from posfair.stats.inference import (
    FEW_CLUSTERS,
    FewClustersWarning,
    Inference,
    InferenceLabel,
    few_clusters_text,
    significance_mark,
)
from posfair.stats.wild import _wildboottest_tests, wild_tests

__all__ = ["PositionOLS", "fit_position_ols", "position_design"]

log = logging.getLogger(__name__)


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
    #: per coefficient the inference its p-value used, typed (the wild bootstrap's G may differ between coefficients)
    inference_used: tuple[InferenceLabel, ...] = ()
    cluster_by: str = ""  # e.g. "set+topic (90 sets, 53 topics)"
    result: Any = field(default=None, compare=False, repr=False)
    fit: ClusteredFit | None = field(default=None, compare=False, repr=False)

    @property
    def inference(self) -> str:
        """The short label(s) of :attr:`inference_used` (``CR1 conservative t(G-1)``; distinct ones joined by ``; ``)."""
        return "; ".join(dict.fromkeys(u.text() for u in self.inference_used))

    @property
    def G(self) -> np.ndarray:
        """Per coefficient the clusters its interval and p-value rest on."""
        return self.fit.G if self.fit is not None else np.full(self.n, self.n_clusters)

    @property
    def clusters_used(self) -> list[str]:
        """Per coefficient what a cluster is in its interval, with the counts (e.g. ``components (5 of 8 sets ...)``)."""
        return list(self.fit.clusters) if self.fit is not None else [self.cluster_by] * self.n

    @property
    def kinds_used(self) -> list[str]:
        """Per coefficient what a cluster is in its interval, in one word (``sets``, ``components``, ``two-way``): the
        fit's typed kinds (a fit made by hand without one: read off :attr:`cluster_by`)."""
        return list(self.fit.kinds) if self.fit is not None else [cluster_kind(self.cluster_by)] * self.n

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
        the other (its numbers are in :attr:`bse`, :attr:`pvalues`, :meth:`conf_int`).  Where that clustering's
        two-way covariance needed the eigenvalue fix, the coefficient table is rebuilt from the fixed covariance (the
        numbers of :attr:`bse`, ...; statsmodels' results object itself is left as statsmodels made it) and a note
        says that the F-statistic of the header is statsmodels' before the fix.
        """
        out = self.result.summary(xname=self.names, alpha=alpha)
        if self.fit is not None and self.fit.main in self.fit.fixed:
            numbers = self.fit.numbers(self.fit.main, alpha)
            out.tables[1] = summary_params((self.result, *numbers), xname=self.names, alpha=alpha, use_t=True)
            out.add_extra_txt(
                [
                    f"The coefficients use the {self.fit.main} covariance after the eigenvalue fix ({PSD_FIX_NOTE}); "
                    "the F-statistic above is of statsmodels' covariance before it."
                ]
            )
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
                "cluster_kind": self.kinds_used,
                "inference": [u.text() for u in self.inference_used],  # the saved text (coefficients.csv)
                "inference_used": list(self.inference_used),  # typed, in memory only: what captions read
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
    the wider of two-way and component clustering (:func:`posfair.stats.clusters.fit_clustered`).
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
        warnings.warn(few_clusters_text(n_clusters), FewClustersWarning, stacklevel=user_stacklevel())
    tvalues, pvalues = fit.tvalues, fit.pvalues.copy()
    used_each = tuple(inference.used(int(fit.structures[u].bootstrap_codes.max()) + 1) for u in fit.used)
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
            fixed = used in fit.fixed
            if not fixed and not np.allclose(t_wild[pick], tvalues[pick], rtol=1e-6, atol=1e-9):
                raise RuntimeError(f"wild bootstrap t statistics {t_wild} differ from the CR1 fit's {tvalues}")
            pvalues[pick] = p_wild[pick]
            log.debug("wild bootstrap (%s, %s): p=%s", inference.label(), used, p_wild)
    return PositionOLS(
        n=n,
        params=fit.params,
        bse=fit.bse,
        pvalues=np.asarray(pvalues),
        nobs=len(y),
        n_clusters=n_clusters,
        tvalues=tvalues,
        inference_used=used_each,
        cluster_by=fit.cluster_by(),
        result=fit.result,
        fit=fit,
    )
