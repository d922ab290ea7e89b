"""How an audit's p-values are computed (:class:`Inference`), the paper's significance marks, and the
sentences that say so in captions.

What is a cluster (:attr:`Inference.clusters`, see :mod:`posfair.stats.clusters`):
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
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from posfair.runtime.errors import PosfairInputError
from posfair.stats.clusters import CLUSTERINGS, DEFAULT_CLUSTERS, Clustering

__all__ = [
    "Inference",
    "InferenceLabel",
    "describe_inference",
    "read_inference_labels",
    "significance_mark",
    "few_clusters_text",
    "MARKS",
    "MARK_LEGEND",
    "INFERENCE_METHODS",
    "BOOTSTRAP_WEIGHTS",
    "InferenceMethod",
    "BootstrapWeights",
    "FEW_CLUSTERS",
    "FewClustersWarning",
    "CLUSTERS_IN_WORDS",
]

#: (upper p bound, mark): p < 0.001 is unmarked, as in the paper's tables.
MARKS: tuple[tuple[float, str], ...] = ((0.001, ""), (0.01, "◊"), (0.05, "□"))
NOT_SIGNIFICANT = "•"
MARK_LEGEND = "all values p < 0.001 unless marked: ◊ p < 0.01, □ p < 0.05, • not significant (p ≥ 0.05)"

#: how p-values are computed: CR1 + t(G-1), or the wild cluster bootstrap
InferenceMethod = Literal["cluster", "wild"]
#: the wild bootstrap's weights
BootstrapWeights = Literal["webb", "rademacher"]
INFERENCE_METHODS: tuple[InferenceMethod, ...] = get_args(InferenceMethod)
BOOTSTRAP_WEIGHTS: tuple[BootstrapWeights, ...] = get_args(BootstrapWeights)
#: below this many clusters a fit warns: cluster-robust inference is unreliable with few clusters
FEW_CLUSTERS = 20


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
            (see :mod:`posfair.stats.clusters`).
    """

    method: InferenceMethod = "cluster"
    draws: int = 9999
    weights: BootstrapWeights = "webb"
    seed: int = 0
    clusters: Clustering = DEFAULT_CLUSTERS

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

    def used(self, n_clusters: int | None = None) -> InferenceLabel:
        """The inference a fit on ``n_clusters`` bootstrap clusters used, typed (decides whether Rademacher weights
        are enumerated)."""
        if self.method == "cluster":
            return InferenceLabel("cluster", self.clusters)
        if n_clusters is not None and self.enumerates(n_clusters):
            return InferenceLabel("wild", self.clusters, "rademacher", enumerated=n_clusters)
        return InferenceLabel("wild", self.clusters, self.weights, self.draws, self.seed)

    def label(self, n_clusters: int | None = None) -> str:
        """Short label for tables: ``CR1 set+topic t(G-1)`` or ``wild WCR11 set webb B=9999 seed=0`` (or ``... all 2^G``).

        ``n_clusters``: the bootstrap's cluster count (decides whether Rademacher weights are enumerated).
        """
        return self.used(n_clusters).text()

    def describe(self) -> str:
        """A sentence for captions and reports."""
        return self.used().sentence()

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


_CLUSTERS = "|".join(re.escape(c) for c in sorted(CLUSTERINGS, key=len, reverse=True))
_CR1 = re.compile(rf"CR1 (?P<clusters>{_CLUSTERS}) t\(G-1\)")
_WILD = re.compile(
    rf"wild WCR11 (?:(?P<clusters>{_CLUSTERS}) )?(?:rademacher all 2\^(?P<G>\d+)"
    rf"|(?P<weights>{'|'.join(BOOTSTRAP_WEIGHTS)}) B=(?P<draws>\d+) seed=(?P<seed>\d+))"
)


@dataclass(frozen=True)
class InferenceLabel:
    """The inference one fit used, typed: :meth:`text` is the short label a table's ``inference`` column holds
    (:meth:`Inference.label`), :meth:`parse` the one reader of a saved label (it round-trips :meth:`text`),
    :meth:`sentence` the same in words for captions.

    ``method``: ``"cluster"`` or ``"wild"``; ``clusters``: one of :data:`~posfair.stats.clusters.CLUSTERINGS`;
    wild only: ``weights``, ``draws``, ``seed``, and ``enumerated`` = G where all 2^G Rademacher sign vectors were
    enumerated (then draws and seed play no part).  Checked when made: a value outside its type is an error, not a
    label no reader knows.
    """

    method: InferenceMethod
    clusters: Clustering
    weights: BootstrapWeights | None = None
    draws: int = 0
    seed: int = 0
    enumerated: int | None = None

    def __post_init__(self) -> None:
        if self.method not in INFERENCE_METHODS:
            raise ValueError(f"inference method must be one of {INFERENCE_METHODS}; got {self.method!r}")
        if self.clusters not in CLUSTERINGS:
            raise ValueError(f"clusters must be one of {CLUSTERINGS}; got {self.clusters!r}")
        if (self.weights is None) != (self.method == "cluster") or (
            self.weights is not None and self.weights not in BOOTSTRAP_WEIGHTS
        ):
            raise ValueError(f"weights: one of {BOOTSTRAP_WEIGHTS} for the wild bootstrap only; got {self.weights!r}")

    def text(self) -> str:
        if self.method == "cluster":
            return f"CR1 {self.clusters} t(G-1)"
        return f"wild WCR11 {self.clusters} {self._draws_text()}"

    def _draws_text(self) -> str:
        if self.enumerated is not None:
            return f"rademacher all 2^{self.enumerated}"
        return f"{self.weights} B={self.draws} seed={self.seed}"

    @classmethod
    def parse(cls, label: str) -> InferenceLabel | None:
        """The typed value of a saved label (None: not a label :meth:`text` writes); labels of runs saved before
        clusters were named (``CR1 t(G-1)``, ``wild WCR11 webb ...``) read as clustered by set."""
        label = str(label)
        if label == "CR1 t(G-1)":
            return cls("cluster", "set")
        if m := _CR1.fullmatch(label):
            return cls("cluster", m["clusters"])
        if (m := _WILD.fullmatch(label)) is None:
            return None
        clusters = m["clusters"] or "set"
        if m["G"] is not None:
            return cls("wild", clusters, "rademacher", enumerated=int(m["G"]))
        return cls("wild", clusters, m["weights"], int(m["draws"]), int(m["seed"]))

    def sentence(self) -> str:
        """This inference in words (captions, reports)."""
        by = self.clusters
        if self.method == "cluster":
            return (
                f"CR1 cluster-robust standard errors ({CLUSTERS_IN_WORDS[by]}; correction G/(G-1) * (N-1)/(N-K) per "
                "dimension), p-values from Student's t with G-1 degrees of freedom"
            )
        return (
            "CR1 cluster-robust standard errors; p-values from a wild cluster bootstrap-t (WCR11: null imposed, CR1 "
            f"variance in every draw, {CLUSTERS_IN_WORDS[by]}; weights per cluster"
            + (" of the dimension with fewer clusters" if by == "set+topic" else "")
            + f"; {self._draws_text()}; p = share of |t*| ≥ |t| with the observed statistic counted as one draw, or "
            "over all 2^G Rademacher sign vectors where enumerated)"
        )


def describe_inference(labels: Iterable[InferenceLabel | str]) -> str:
    """A sentence for captions from the inferences a table's fits used: typed values (:class:`InferenceLabel`, what
    a fresh fit carries) are put in words as they are; a short label of :meth:`Inference.label` -- the text column of
    a table saved by an older run -- is read back by :meth:`InferenceLabel.parse` (a label it does not know is kept
    as it is)."""
    parts = []
    for lab in dict.fromkeys(labels):
        used = lab if isinstance(lab, InferenceLabel) else InferenceLabel.parse(str(lab))
        parts.append(used.sentence() if used is not None else str(lab))
    return "; ".join(dict.fromkeys(parts))


def read_inference_labels(texts: Iterable[str]) -> list[InferenceLabel | str]:
    """The typed inferences of a saved table's ``inference`` column (a ``coefficients.csv`` read back): each label
    parsed once by :meth:`InferenceLabel.parse`; one it does not know is kept as its text."""
    out: list[InferenceLabel | str] = []
    for text in texts:
        used = InferenceLabel.parse(str(text))
        out.append(used if used is not None else str(text))
    return out


def few_clusters_text(n_clusters: int) -> str:
    return (
        f"the positional regression rests on G = {n_clusters} clusters, fewer than {FEW_CLUSTERS}: "
        "cluster-robust p-values are approximate; raise the document count (more segment sets) or use the wild "
        "cluster bootstrap (--inference wild)"
    )
