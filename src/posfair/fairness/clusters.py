"""Which observations of an audit are dependent, and clustered OLS that respects it.

An audit observation is one segment at one position of one document.  Two observations are
dependent when they come from the same *segment set* (the n! orderings of one set share their
segments) or show the same *topic* (one corpus id, in any language): a topic drawn into two
sets, or into two instances of a language grid, ties those sets together.  Three ways to
cluster (:data:`CLUSTERINGS`):

``set+topic`` (the default)
    Two-way cluster-robust covariance (Cameron, Gelbach and Miller 2011):
    ``V = V_set + V_topic - V_set∩topic``, each term CR1 with its own ``G/(G-1) * (N-1)/(N-K)``
    correction, exactly statsmodels' ``cov_type="cluster"`` with two group columns; p-values from
    t with ``min(G_set, G_topic) - 1`` degrees of freedom.  When no topic is in two sets the
    topic clusters nest in the set clusters and ``V`` equals the one-way set-clustered ``V``
    exactly (the papers' inference), so the default costs nothing where the papers' assumption
    holds and widens the intervals where it does not.
``set``
    One-way CR1 by segment set, the papers' choice; right only when sets share no topic.
``component``
    One-way CR1 by connected component of the set-topic graph (sets joined by a shared topic):
    valid under any sharing, but a grid whose sets all hang together has G = 1 or 2.

:func:`cluster_structure` builds the codes and counts; :func:`clustered_ols` is the one fit
that the positional regression (:mod:`posfair.fairness.ols`) and the pooled language
regression (:mod:`posfair.fairness.language`) both use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from statsmodels.regression.linear_model import OLS

from posfair.errors import PosfairInputError

__all__ = [
    "CLUSTERINGS",
    "ClusterStructure",
    "cluster_structure",
    "clustered_ols",
    "connected_components",
    "psd_fixed",
    "PSD_FIX_NOTE",
]

CLUSTERINGS = ("set+topic", "set", "component")


@dataclass(frozen=True)
class ClusterStructure:
    """Cluster codes of the observations and the counts the inference rests on.

    ``codes``: (N,) one-way codes, or (N, 2) set and topic codes for ``set+topic``; codes follow the
    sorted order of the ids, so results do not depend on the row order.  ``G``: the number of
    clusters the t degrees of freedom (``G - 1``) and the few-clusters warning use.
    """

    by: str
    codes: np.ndarray
    n_sets: int
    n_topics: int
    n_components: int
    shared_topics: int  # topics that appear in more than one segment set

    @property
    def G(self) -> int:
        if self.by == "set" or (self.by == "set+topic" and self.codes.ndim == 1):
            return self.n_sets
        if self.by == "component":
            return self.n_components
        return min(self.n_sets, self.n_topics)

    @property
    def bootstrap_codes(self) -> np.ndarray:
        """The one dimension a wild bootstrap draws its weights for: the one with fewer clusters
        (MacKinnon, Nielsen and Webb 2021) for ``set+topic``, else the clusters themselves."""
        if self.codes.ndim == 1:
            return self.codes
        return self.codes[:, 0] if self.n_sets <= self.n_topics else self.codes[:, 1]

    def variance_dimensions(self) -> list[np.ndarray]:
        """(codes, sign) pairs of the covariance terms: one for one-way, set + topic - intersection for two-way."""
        if self.codes.ndim == 1:
            return [(self.codes, 1.0)]
        both = _codes(pd.Series(list(zip(self.codes[:, 0], self.codes[:, 1], strict=True))).astype(str))
        return [(self.codes[:, 0], 1.0), (self.codes[:, 1], 1.0), (both, -1.0)]

    def label(self) -> str:
        """Short text for tables: ``set+topic (90 sets, 53 topics)``."""
        if self.by == "set":
            return f"set ({self.n_sets} sets)"
        if self.by == "component":
            return f"component ({self.n_components} components of {self.n_sets} sets)"
        return f"set+topic ({self.n_sets} sets, {self.n_topics} topics)"


def _codes(values) -> np.ndarray:
    return pd.Series(np.asarray(values)).astype(str).astype("category").cat.codes.to_numpy().astype(np.int64)


def connected_components(sets, topics) -> np.ndarray:
    """Per observation, the connected component (0-based, in order of the smallest set id) of the
    bipartite graph whose edges are the observations' (set, topic) pairs."""
    s, t = _codes(sets), _codes(topics)
    n_s = int(s.max()) + 1 if len(s) else 0
    parent = list(range(n_s + (int(t.max()) + 1 if len(t) else 0)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in set(zip(s.tolist(), (t + n_s).tolist(), strict=True)):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([find(int(a)) for a in s], dtype=np.int64)
    return _codes(roots)


def cluster_structure(sets, topics=None, by: str = "set+topic") -> ClusterStructure:
    """Codes and counts for clustering by ``by`` (:data:`CLUSTERINGS`); ``topics`` is needed unless ``by="set"``."""
    if by not in CLUSTERINGS:
        raise PosfairInputError(f"clusters must be one of {', '.join(CLUSTERINGS)}; got {by!r}")
    sets = np.asarray(sets).astype(str)
    s = _codes(sets)
    n_sets = int(s.max()) + 1 if len(s) else 0
    if topics is None:
        if by != "set":
            raise ValueError(f"clustering by {by} needs the topic of every observation")
        return ClusterStructure("set", s, n_sets, 0, n_sets, 0)
    topics = np.asarray(topics).astype(str)
    if len(topics) != len(sets):
        raise ValueError("sets and topics must have the same length")
    t = _codes(topics)
    comp = connected_components(sets, topics)
    pairs = pd.DataFrame({"s": s, "t": t}).drop_duplicates()
    shared = int((pairs.groupby("t")["s"].nunique() > 1).sum())
    # no topic in two sets: the topic clusters nest in the set clusters and the two-way covariance is the one-way
    # set covariance term for term, so the one-way codes are used (the same numbers, and the wild bootstrap of
    # one-way clusters)
    two_way = np.column_stack([s, t]) if shared else s
    codes = {"set": s, "component": comp, "set+topic": two_way}[by]
    return ClusterStructure(by, codes, n_sets, int(t.max()) + 1, int(comp.max()) + 1, shared)


#: appended to the clustering's label when the two-way covariance needed the eigenvalue fix
PSD_FIX_NOTE = (
    "covariance made positive semi-definite (negative eigenvalues set to 0, as Cameron, Gelbach and Miller advise)"
)


def psd_fixed(V: np.ndarray) -> np.ndarray | None:
    """``V`` with its negative eigenvalues set to 0, or None when it has none (a two-way
    ``V_set + V_topic - V_set∩topic`` need not be positive semi-definite in a finite sample)."""
    w, U = np.linalg.eigh((V + V.T) / 2)
    if w.min() >= 0:
        return None
    return (U * np.clip(w, 0, None)) @ U.T


def clustered_ols(y: np.ndarray, X: np.ndarray, structure: ClusterStructure) -> tuple[Any, str]:
    """statsmodels OLS with the covariance of ``structure`` and t(G-1) inference; its degrees of freedom checked.

    Returns the results object and the clustering's label (:meth:`ClusterStructure.label`, plus
    :data:`PSD_FIX_NOTE` when a two-way covariance had negative eigenvalues and was fixed: the
    results object's ``bse``, ``pvalues`` and ``conf_int`` then use the fixed covariance).
    """
    if structure.G < 2:
        raise PosfairInputError(
            f"clustered standard errors need at least 2 clusters; clustering by {structure.label()} gives "
            f"G = {structure.G} (use clusters 'set+topic' or draw more segment sets)"
        )
    res = OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": structure.codes}, use_t=True)
    if getattr(res, "df_resid_inference", None) != structure.G - 1:  # statsmodels' contract, checked not assumed
        raise RuntimeError(
            f"statsmodels used {getattr(res, 'df_resid_inference', None)} degrees of freedom, expected G-1 = {structure.G - 1}"
        )
    label = structure.label()
    if structure.codes.ndim == 2 and (fixed := psd_fixed(np.asarray(res.cov_params()))) is not None:
        # statsmodels' own way of giving a results object another covariance (as its fit_constrained does)
        res._results.cov_params_default = fixed
        res._results._cache = {}
        label += f"; {PSD_FIX_NOTE}"
    return res, label
