"""Which observations of an audit are dependent, and clustered OLS that respects it.

An audit observation is one segment at one position of one document.  Two observations are
dependent when they come from the same *segment set* (the n! orderings of one set share their
segments) or show the same *topic* (one corpus id, in any language): a topic drawn into two
sets, or into two instances of a language grid, ties those sets together.  Three ways to
cluster (:data:`CLUSTERINGS`):

``conservative`` (the default)
    Per coefficient (or any linear combination, or ratio) the wider of the two intervals below, two-way
    ``set+topic`` and ``component``, at t(G-1) with that clustering's own G (:func:`conservative_choice`, the
    rule :func:`joint_ols` applies and :func:`fit_clustered` gives every coefficient of one fit): a cluster
    structure of its own is not one of :data:`STRUCTURES`, it says per interval which clustering it used.  When
    no topic is in two sets both are the one-way set clustering (components = sets) and it says so.
``set+topic``
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

:func:`cluster_structure` builds the codes and counts of one of :data:`STRUCTURES`; :func:`fit_clustered` is
the one fit that the positional regression (:mod:`posfair.stats.position_ols`) and the pooled language regression
(:mod:`posfair.fairness.language`) both use, for every clustering (``conservative`` through :func:`joint_ols`, the
others through :func:`clustered_ols`).

Intervals on what the data can bear (:func:`joint_ols`, :class:`JointFit`): several outcomes on
one design (e.g. σ stock and σ calibrated of the same documents) with their *joint* CR1
covariance, under two-way set+topic clustering and under component clustering.  Every interval
it gives -- a coefficient, a calibrated-minus-stock change, a share removed (a ratio, Fieller) --
is the more conservative (wider) of the two, and says which it used and its G: the components
where sets share topics and the components are the wider (t with G_components - 1 degrees of
freedom), two-way where that is wider; where no topic is in two sets both are the one-way set
clustering and G is the number of sets.  The audit's family findings
(:mod:`posfair.fairness.families`) and ``scripts/language_findings.py`` use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.linear_model import OLS

from posfair.runtime.errors import PosfairInputError

__all__ = [
    "CLUSTERINGS",
    "STRUCTURES",
    "Clustering",
    "Structure",
    "Kind",
    "ClusterChoice",
    "DEFAULT_CLUSTERS",
    "ClusterStructure",
    "ClusteredFit",
    "fit_clustered",
    "conservative_choice",
    "cluster_kind",
    "KINDS",
    "cluster_structure",
    "clustered_ols",
    "connected_components",
    "psd_fixed",
    "PSD_FIX_NOTE",
    "JointFit",
    "Interval",
    "joint_ols",
    "cr1_covariance",
    "fieller",
]

#: a cluster structure (codes of one clustering)
Structure = Literal["set+topic", "set", "component"]
#: what an audit's intervals may be clustered by: a structure, or per interval the wider of two-way and components
Clustering = Literal["conservative", "set+topic", "set", "component"]
#: what a cluster is, in one word (the ``kind`` of an interval)
Kind = Literal["sets", "components", "two-way"]
STRUCTURES: tuple[Structure, ...] = get_args(Structure)
CLUSTERINGS: tuple[Clustering, ...] = get_args(Clustering)
DEFAULT_CLUSTERS: Clustering = "conservative"


@dataclass(frozen=True)
class ClusterStructure:
    """Cluster codes of the observations and the counts the inference rests on.

    ``codes``: (N,) one-way codes, or (N, 2) set and topic codes for ``set+topic``; codes follow the
    sorted order of the ids, so results do not depend on the row order.  ``G``: the number of
    clusters the t degrees of freedom (``G - 1``) and the few-clusters warning use.
    """

    by: Structure
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


def cluster_structure(sets, topics=None, by: Structure = "set+topic") -> ClusterStructure:
    """Codes and counts for clustering by ``by`` (:data:`STRUCTURES`); ``topics`` is needed unless ``by="set"``."""
    if by not in STRUCTURES:
        raise PosfairInputError(f"cluster structures are {', '.join(STRUCTURES)}; got {by!r}")
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


def clustered_ols(y: np.ndarray, X: np.ndarray, structure: ClusterStructure) -> tuple[Any, str, np.ndarray | None]:
    """statsmodels OLS with the covariance of ``structure`` and t(G-1) inference; its degrees of freedom checked.

    Returns the results object (statsmodels' own, never modified), the clustering's label
    (:meth:`ClusterStructure.label`, plus :data:`PSD_FIX_NOTE` when a two-way covariance had negative eigenvalues and
    was fixed) and the fixed covariance (None: no fix needed; the numbers are then the results object's own, else
    :func:`t_numbers` of the fixed covariance).
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
    fixed = psd_fixed(np.asarray(res.cov_params())) if structure.codes.ndim == 2 else None
    if fixed is not None:
        label += f"; {PSD_FIX_NOTE}"
    return res, label, fixed


def t_numbers(params: np.ndarray, cov: np.ndarray, G: int, alpha: float = 0.05) -> tuple[np.ndarray, ...]:
    """(standard errors, t, p, (k, 2) intervals) of ``params`` under the covariance ``cov`` at t(G-1), computed as
    statsmodels computes them from its own covariance (``use_t=True``, ``df_resid_inference = G - 1``): the same
    numbers to the last bit, without giving statsmodels' results object another covariance."""
    params = np.asarray(params)
    with np.errstate(invalid="ignore", divide="ignore"):
        bse = np.sqrt(np.diag(cov))
        tvalues = params / bse
    pvalues = stats.t.sf(np.abs(tvalues), G - 1) * 2
    q = stats.t.ppf(1 - alpha / 2, G - 1)
    return bse, tvalues, pvalues, np.column_stack([params - q * bse, params + q * bse])


# -- intervals under the more conservative of component and two-way clustering ---------------------------------------


def cr1_covariance(X: np.ndarray, U: np.ndarray, structure: ClusterStructure) -> np.ndarray:
    """The joint CR1 covariance of the OLS fits of ``m`` outcomes on one design ``X`` (N, K), residuals ``U`` (N, m).

    Coefficients are stacked outcome by outcome (``m * K``).  Per clustering dimension (one for one-way; set, topic
    and their intersection with signs +, +, - for two-way) ``G/(G-1) * (N-1)/(N-K) * B M B`` with ``B`` the block
    diagonal of ``(X'X)^-1`` and ``M = sum_g s_g s_g'``, ``s_g`` the stacked ``X_g' u_g`` of every outcome: each
    diagonal block is statsmodels' ``cov_type="cluster"`` covariance of that outcome's fit, and the off-diagonal
    blocks are what the fits share (the covariance of stock and calibrated coefficients of the same documents).
    """
    X = np.asarray(X, dtype=np.float64)
    U = np.asarray(U, dtype=np.float64).reshape(len(X), -1)
    N, K = X.shape
    m = U.shape[1]
    A = np.linalg.inv(X.T @ X)
    B = np.kron(np.eye(m), A)
    scores = (X[:, None, :] * U[:, :, None]).reshape(N, m * K)  # row i: (x_i u_i1, ..., x_i u_im)
    V = np.zeros((m * K, m * K))
    for codes, sign in structure.variance_dimensions():
        G = int(codes.max()) + 1
        sums = np.zeros((G, m * K))
        np.add.at(sums, codes, scores)
        V += sign * G / (G - 1) * (N - 1) / (N - K) * (sums.T @ sums)
    return B @ V @ B


def fieller(num: float, den: float, v_num: float, v_den: float, cov: float, crit: float) -> tuple[float, float]:
    """Fieller's interval of ``num / den`` (``crit``: the t quantile); (nan, nan) when unbounded, i.e. when the
    denominator is not distinguishable from 0 at that level (``den^2 <= crit^2 v_den``)."""
    a = den**2 - crit**2 * v_den
    b = num * den - crit**2 * cov
    c = num**2 - crit**2 * v_num
    disc = b**2 - a * c
    if a <= 0 or disc < 0:
        return float("nan"), float("nan")
    root = np.sqrt(disc)
    return float((b - root) / a), float((b + root) / a)


#: what a cluster is, in one word, per structure (the ``kind`` of an interval; :func:`cluster_kind` reads it back
#: from the label of a run saved before the kind was written beside it)
KINDS: dict[Structure, Kind] = {"set": "sets", "component": "components", "set+topic": "two-way"}


@dataclass(frozen=True)
class ClusterChoice:
    """Which clustering one interval uses under ``conservative`` (:func:`conservative_choice`).

    ``by``: the structure whose interval is used (``"component"`` or ``"set+topic"``); ``kind``: what a cluster is
    then, in one word (``"sets"`` where no topic is in two sets: both structures are the sets); ``why``: the label a
    table shows, which clustering and why, with its counts."""

    by: Structure
    kind: Kind
    why: str


def conservative_choice(
    two: ClusterStructure, comp: ClusterStructure, widths: dict[str, float], two_fixed: bool = False
) -> ClusterChoice:
    """The one rule of ``conservative`` clustering: which of two-way (``two``) and component (``comp``) clustering an
    interval uses, and why in words with its counts -- the one with the wider interval (``widths``: per ``"set+topic"``
    and ``"component"`` the interval's width at t(G-1) with that clustering's own G; inf = unbounded).

    No topic in two sets: both are the one-way set clustering (``"component"``, said to be the sets).  One connected
    component: components give no cluster-robust interval, two-way is used and said to assume the topics' dependence
    additive.  Ties go to the components.  ``two_fixed``: whether the two-way covariance needed the eigenvalue fix
    (:func:`psd_fixed`; the label then names it).
    """
    if two.shared_topics == 0:
        return ClusterChoice(
            "component", "sets", f"sets ({two.n_sets} sets, no topic in two sets: two-way = components = sets)"
        )
    fix = f"; {PSD_FIX_NOTE}" if two_fixed else ""
    if comp.n_components < 2:
        return ClusterChoice(
            "set+topic",
            "two-way",
            f"set+topic ({two.n_sets} sets, {two.n_topics} topics; the sets form 1 connected component, which "
            f"gives no cluster-robust interval: two-way, which assumes the topics' dependence is additive{fix})",
        )
    if widths["component"] >= widths["set+topic"]:
        return ClusterChoice(
            "component",
            "components",
            f"components ({comp.n_components} of {comp.n_sets} sets sharing topics; wider than two-way)",
        )
    return ClusterChoice(
        "set+topic",
        "two-way",
        f"set+topic ({two.n_sets} sets, {two.n_topics} topics; wider than the {comp.n_components} components{fix})",
    )


def cluster_kind(label: str) -> str:
    """The short name of the clustering the interval label of a run *saved before the kind was written beside it*
    (``cluster_by`` of an old ``coefficients.csv``) names: ``sets``, ``components`` or ``two-way``.  A fit carries
    it typed (:attr:`Interval.kind`, :attr:`ClusteredFit.kinds`) and so does every coefficient row since
    (``cluster_kind``)."""
    head = str(label).split(" ", 1)[0]
    return KINDS.get(head, head)


@dataclass(frozen=True)
class Interval:
    """One quantity with its interval, under the clustering that gave the wider interval (:class:`JointFit`).

    ``clusters``: which clustering was used and why, with its counts (e.g. ``components (12 of 24 sets; wider than
    two-way)``); ``G``: the clusters the t(G-1) quantile rests on; ``other``: the interval the other clustering gave.
    A ratio's interval is Fieller's; (nan, nan) = unbounded (its denominator is not distinguishable from 0), and
    its ``se`` is the delta method's (for heterogeneity tests).
    """

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    G: int
    clusters: str
    p: float = float("nan")
    other: tuple[float, float] = (float("nan"), float("nan"))
    by: Structure | None = None  # the structure used: "component" or "set+topic" (None: not of a JointFit)
    kind: Kind | None = None  # what a cluster is, in one word: "sets", "components" or "two-way"

    @property
    def bounded(self) -> bool:
        return bool(np.isfinite(self.ci_low) and np.isfinite(self.ci_high))

    def to_dict(self, prefix: str = "") -> dict[str, Any]:
        return {
            f"{prefix}estimate": self.estimate,
            f"{prefix}se": self.se,
            f"{prefix}ci_low": self.ci_low,
            f"{prefix}ci_high": self.ci_high,
            f"{prefix}p": self.p,
            f"{prefix}G": self.G,
            f"{prefix}clusters": self.clusters,
            f"{prefix}kind": self.kind,
        }


def _width(lo: float, hi: float) -> float:
    return hi - lo if np.isfinite(lo) and np.isfinite(hi) else float("inf")


@dataclass(frozen=True)
class JointFit:
    """OLS fits of ``m`` outcomes on one design with their joint covariance under two clusterings (:func:`joint_ols`).

    ``params``: (m * K,) the coefficients stacked outcome by outcome; ``variants``: per clustering
    (``"set+topic"``, ``"component"``) its :class:`ClusterStructure`, joint covariance and label; ``fixed``: the
    clusterings whose covariance needed the eigenvalue fix (:func:`psd_fixed`).
    """

    params: np.ndarray
    K: int
    variants: dict[str, tuple[ClusterStructure, np.ndarray, str]]
    level: float = 0.95
    fixed: frozenset[str] = frozenset()

    def coef(self, outcome: int, j: int) -> np.ndarray:
        """The weight vector picking coefficient ``j`` of outcome ``outcome``."""
        a = np.zeros(len(self.params))
        a[outcome * self.K + j] = 1.0
        return a

    def _crit(self, G: int) -> float:
        return float(stats.t.ppf(0.5 + self.level / 2, G - 1)) if G >= 2 else float("inf")

    def _choose(self, widths: dict[str, float]) -> ClusterChoice:
        """:func:`conservative_choice` of the two variants."""
        return conservative_choice(
            self.variants["set+topic"][0], self.variants["component"][0], widths, "set+topic" in self.fixed
        )

    def linear(self, a: np.ndarray) -> Interval:
        """``a . params`` with its t(G-1) interval under the more conservative clustering."""
        est = float(a @ self.params)
        got = {}
        for by, (st, V, _label) in self.variants.items():
            se = float(np.sqrt(max(a @ V @ a, 0.0)))
            half = self._crit(st.G) * se
            got[by] = (se, est - half, est + half, st.G)
        choice = self._choose({k: _width(v[1], v[2]) for k, v in got.items()})
        se, lo, hi, G = got[choice.by]
        other = next((got[k] for k in got if k != choice.by), got[choice.by])
        p = float(2 * stats.t.sf(abs(est / se), G - 1)) if se > 0 and G >= 2 else float("nan")
        return Interval(est, se, lo, hi, G, choice.why, p, (other[1], other[2]), choice.by, choice.kind)

    def ratio(self, a_num: np.ndarray, a_den: np.ndarray) -> Interval:
        """``(a_num . params) / (a_den . params)`` with Fieller's interval under the more conservative clustering."""
        num, den = float(a_num @ self.params), float(a_den @ self.params)
        est = num / den if den != 0 else float("nan")
        got = {}
        for by, (st, V, _label) in self.variants.items():
            vn, vd, c = float(a_num @ V @ a_num), float(a_den @ V @ a_den), float(a_num @ V @ a_den)
            lo, hi = fieller(num, den, vn, vd, c, self._crit(st.G))
            delta = np.sqrt(max(vn / den**2 + num**2 * vd / den**4 - 2 * num * c / den**3, 0.0)) if den else np.nan
            got[by] = (float(delta), lo, hi, st.G)
        choice = self._choose({k: _width(v[1], v[2]) for k, v in got.items()})
        se, lo, hi, G = got[choice.by]
        other = next((got[k] for k in got if k != choice.by), got[choice.by])
        return Interval(est, se, lo, hi, G, choice.why, float("nan"), (other[1], other[2]), choice.by, choice.kind)


def joint_ols(X: np.ndarray, Y: np.ndarray, sets, topics, level: float = 0.95) -> JointFit:
    """Fit every column of ``Y`` (N, m) on ``X`` (N, K); the joint CR1 covariance clustered two-way by set and topic
    and by connected component (:func:`cr1_covariance`), for :meth:`JointFit.linear` and :meth:`JointFit.ratio`.

    A two-way covariance with negative eigenvalues is made positive semi-definite (:func:`psd_fixed`), and its label
    says so.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(len(X), -1)
    beta = np.linalg.lstsq(X, Y, rcond=None)[0]  # (K, m)
    U = Y - X @ beta
    variants, fixed_by = {}, set()
    for by in ("set+topic", "component"):
        st = cluster_structure(sets, topics, by)
        if st.G < 2:
            V = np.full((Y.shape[1] * X.shape[1],) * 2, np.nan)
        else:
            V = cr1_covariance(X, U, st)
        label = st.label()
        if by == "set+topic" and st.codes.ndim == 2 and (fixed := psd_fixed(V)) is not None:
            V, label = fixed, f"{label}; {PSD_FIX_NOTE}"
            fixed_by.add(by)
        variants[by] = (st, V, label)
    return JointFit(beta.T.ravel(), X.shape[1], variants, level, frozenset(fixed_by))


# -- one fit for every clustering ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusteredFit:
    """One OLS fit with per-coefficient cluster-robust inference (:func:`fit_clustered`).

    ``G``, ``clusters`` (the label: what a cluster is, with its counts, e.g. ``components (5 of 8 sets sharing
    topics; wider than two-way)``) and ``used`` (the structure: ``set``, ``set+topic`` or ``component``) are per
    coefficient: under ``conservative`` each coefficient has the clustering of its wider interval; under a structure
    all have that one; ``kinds``: per coefficient that clustering in one word (``sets``, ``components``,
    ``two-way``).  ``ci``: the 95 % intervals, t(G-1) with each coefficient's G.  ``results``: statsmodels' results
    object per structure fitted (its ``bse`` / ``pvalues`` are that clustering's, for every coefficient), never
    modified; ``fixed``: per structure whose two-way covariance needed the eigenvalue fix (:func:`psd_fixed`) the
    fixed covariance, whose numbers (:meth:`numbers`) replace the results object's.
    """

    by: Clustering
    params: np.ndarray
    bse: np.ndarray
    tvalues: np.ndarray
    pvalues: np.ndarray
    ci: np.ndarray
    G: np.ndarray
    clusters: tuple[str, ...]
    used: tuple[Structure, ...]
    structures: dict[str, ClusterStructure]
    results: dict[str, Any]
    kinds: tuple[Kind, ...] = ()
    fixed: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def psd_fixed(self) -> tuple[bool, ...]:
        """Per coefficient whether the covariance of its interval needed the eigenvalue fix."""
        return tuple(u in self.fixed for u in self.used)

    def numbers(self, by: str, alpha: float = 0.05) -> tuple[np.ndarray, ...]:
        """(params, se, t, p, (k, 2) intervals) of every coefficient under the structure ``by``: statsmodels' own, or
        where its covariance was fixed, :func:`t_numbers` of the fixed one."""
        res = self.results[by]
        if by in self.fixed:
            return (np.asarray(res.params), *t_numbers(res.params, self.fixed[by], self.structures[by].G, alpha))
        return tuple(np.asarray(x) for x in (res.params, res.bse, res.tvalues, res.pvalues, res.conf_int(alpha)))

    @property
    def n_clusters(self) -> int:
        """The fewest clusters any coefficient's interval rests on."""
        return int(self.G.min())

    @property
    def main(self) -> str:
        """The structure most coefficients used (ties: the components)."""
        counts = {u: self.used.count(u) for u in dict.fromkeys(self.used)}
        top = max(counts.values())
        return "component" if counts.get("component") == top else max(counts, key=counts.get)

    @property
    def result(self) -> Any:
        """statsmodels' results object of :attr:`main` (coefficients whose interval used another clustering differ
        from it: :meth:`notes` names them)."""
        return self.results[self.main]

    def conf_int(self, alpha: float = 0.05) -> np.ndarray:
        """(k, 2): each coefficient's interval at t(G-1) of its own clustering (the one chosen at 95 %)."""
        if alpha == 0.05:
            return self.ci.copy()
        crit = stats.t.ppf(1 - alpha / 2, self.G - 1)
        return np.column_stack([self.params - crit * self.bse, self.params + crit * self.bse])

    def cluster_by(self) -> str:
        """What a cluster is, for a table's ``cluster_by``: the one clustering's label, or each label after its kind
        (``components: components (2 of 8 sets ...); two-way: set+topic (...)``)."""
        kinds = dict(zip(self.clusters, self.kinds, strict=True))  # label -> kind, in order of first use
        return next(iter(kinds)) if len(kinds) == 1 else "; ".join(f"{k}: {c}" for c, k in kinds.items())

    def notes(self, names: list[str]) -> list[str]:
        """Lines for statsmodels' summary: the clustering of every coefficient whose interval is not :attr:`main`'s."""
        other = [
            f"{nm}: G = {g}, {lab}"
            for nm, g, lab, u in zip(names, self.G, self.clusters, self.used, strict=True)
            if u != self.main
        ]
        if not other:
            return []
        return [f"This summary is the {self.main} clustering's; these coefficients' intervals use another:", *other]


def _too_few(label: str, G: int) -> PosfairInputError:
    return PosfairInputError(
        f"clustered standard errors need at least 2 clusters; clustering by {label} gives G = {G} "
        "(draw more segment sets)"
    )


def fit_clustered(y, X, sets, topics=None, by: Clustering = DEFAULT_CLUSTERS) -> ClusteredFit:
    """OLS of ``y`` on ``X`` with CR1 standard errors and t(G-1) inference clustered by ``by`` (:data:`CLUSTERINGS`).

    A structure (``set+topic``, ``set``, ``component``): :func:`clustered_ols`, one clustering for every coefficient.
    ``conservative``: per coefficient the wider interval of two-way and component clustering by the rule of
    :func:`joint_ols` (:func:`conservative_choice`), with the G and the label of the clustering used; the covariance
    of each is checked against statsmodels' fit of the same clustering.
    """
    if by not in CLUSTERINGS:
        raise PosfairInputError(f"clusters must be one of {', '.join(CLUSTERINGS)}; got {by!r}")
    y = np.asarray(y, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    k = X.shape[1]
    if by != "conservative":
        st = cluster_structure(sets, topics, by)
        res, label, fixed = clustered_ols(y, X, st)
        fit = ClusteredFit(
            by,
            *(np.empty(0),) * 5,
            np.full(k, st.G, dtype=np.int64),
            (label,) * k,
            (by,) * k,
            {by: st},
            {by: res},
            (KINDS[by],) * k,
            {} if fixed is None else {by: fixed},
        )
        params, bse, tvalues, pvalues, ci = fit.numbers(by)
        return replace(fit, params=params, bse=bse, tvalues=tvalues, pvalues=pvalues, ci=ci)
    if topics is None:
        raise ValueError("clustering 'conservative' needs the topic of every observation")
    joint = joint_ols(X, y, sets, topics)
    two, comp = joint.variants["set+topic"][0], joint.variants["component"][0]
    if two.G < 2 and comp.G < 2:
        raise _too_few(f"{two.label()} or {comp.label()}", max(two.G, comp.G))
    results, fixed = {}, {}
    for name, (st, V, _label) in joint.variants.items():
        if st.G < 2:
            continue
        res, _, fix = clustered_ols(y, X, st)
        cov = np.asarray(res.cov_params()) if fix is None else fix
        if not np.allclose(cov, V[:k, :k], rtol=1e-6, atol=1e-14):  # checked, not assumed
            raise RuntimeError(f"the {name} covariance of joint_ols differs from statsmodels' fit")
        results[name] = res
        if fix is not None:
            fixed[name] = fix
    got = [joint.linear(joint.coef(0, j)) for j in range(k)]
    if two.shared_topics == 0:  # one-way by set: the same fit under either name
        results.setdefault("component", results.get("set+topic"))
    fit = ClusteredFit(
        by,
        *(np.empty(0),) * 5,
        np.array([g.G for g in got], dtype=np.int64),
        tuple(g.clusters for g in got),
        tuple(g.by for g in got),
        {"set+topic": two, "component": comp},
        results,
        tuple(g.kind for g in got),
        fixed,
    )
    # the numbers of each coefficient are statsmodels' own under the clustering chosen for it (the results object a
    # reader gets back, AuditResult.ols, gives the table's numbers to the last bit; of a fixed two-way covariance,
    # computed as statsmodels computes them); the choice is joint_ols's rule
    numbers = {name: fit.numbers(name) for name in results if results[name] is not None}
    cols = []
    for j, g in enumerate(got):
        if g.by not in numbers:
            cols.append((g.estimate, g.se, g.estimate / g.se if g.se > 0 else np.nan, g.p, g.ci_low, g.ci_high))
            continue
        params, bse, tvalues, pvalues, ci = numbers[g.by]
        cols.append((params[j], bse[j], tvalues[j], pvalues[j], ci[j][0], ci[j][1]))
    cols = np.asarray(cols, dtype=np.float64)
    return replace(fit, params=cols[:, 0], bse=cols[:, 1], tvalues=cols[:, 2], pvalues=cols[:, 3], ci=cols[:, 4:6])
