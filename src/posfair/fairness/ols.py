"""OLS on position dummies with standard errors clustered by segment set.

``y = beta_0 + sum_{p=2..n} beta_p * 1{position = p} + e``; position 1 is the
baseline.  Cluster-robust covariance as in statsmodels ``cov_type="cluster"``
(with its default small-sample correction ``G/(G-1) * (N-1)/(N-K)`` and normal
p-values), which is what the paper's analysis uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["PositionOLS", "fit_position_ols", "significance_mark", "MARKS", "MARK_LEGEND", "position_design"]

#: (upper p bound, mark): p < 0.001 is unmarked, as in the paper's tables.
MARKS: tuple[tuple[float, str], ...] = ((0.001, ""), (0.01, "◊"), (0.05, "□"))
NOT_SIGNIFICANT = "•"
MARK_LEGEND = "all values p < 0.001 unless marked: ◊ p < 0.01, □ p < 0.05, • not significant (p ≥ 0.05)"


def significance_mark(p: float) -> str:
    """The paper's mark for a p-value: '' (p<0.001), '◊' (<0.01), '□' (<0.05), '•' (n.s.)."""
    if p is None or not np.isfinite(p):
        return NOT_SIGNIFICANT
    for bound, mark in MARKS:
        if p < bound:
            return mark
    return NOT_SIGNIFICANT


@dataclass(frozen=True)
class PositionOLS:
    """Coefficients beta_0 (intercept = mean at position 1) and beta_2..beta_n."""

    n: int
    params: np.ndarray  # (n,): beta_0, beta_2, ..., beta_n
    bse: np.ndarray
    pvalues: np.ndarray
    nobs: int
    n_clusters: int

    @property
    def names(self) -> list[str]:
        return ["beta_0"] + [f"beta_{p}" for p in range(2, self.n + 1)]

    @property
    def marks(self) -> list[str]:
        return [significance_mark(p) for p in self.pvalues]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "coef": self.names,
                "position": [1] + list(range(2, self.n + 1)),
                "estimate": self.params,
                "se": self.bse,
                "p": self.pvalues,
                "mark": self.marks,
                "nobs": self.nobs,
                "clusters": self.n_clusters,
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


def fit_position_ols(y, positions, clusters, n: int | None = None) -> PositionOLS:
    """Fit the positional OLS with cluster-robust SEs (clusters = segment-set ids)."""
    import statsmodels.api as sm

    y = np.asarray(y, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.int64)
    if n is None:
        n = int(positions.max())
    if len(y) != len(positions) or len(y) != len(clusters):
        raise ValueError("y, positions and clusters must have the same length")
    if not np.isfinite(y).all():
        raise ValueError(f"{int((~np.isfinite(y)).sum())} non-finite observations in the regression")
    present = set(np.unique(positions).tolist())
    if present != set(range(1, n + 1)):
        raise ValueError(f"positions must cover 1..{n}; got {sorted(present)}")
    groups = pd.factorize(pd.Series(clusters))[0]
    n_clusters = int(groups.max()) + 1
    if n_clusters < 2:
        raise ValueError("clustered standard errors need at least 2 segment sets")
    X = position_design(positions, n)
    res = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": groups})
    return PositionOLS(
        n=n,
        params=np.asarray(res.params),
        bse=np.asarray(res.bse),
        pvalues=np.asarray(res.pvalues),
        nobs=len(y),
        n_clusters=n_clusters,
    )
