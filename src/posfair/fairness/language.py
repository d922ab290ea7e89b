"""Language bias across languages: the pooled language regression.

An audit over :func:`posfair.fairness.documents.language_grid` (every monolingual baseline and
every mixed configuration ``[lead, later, ..., later]``) yields, per instance, the usual
positional OLS, read by :mod:`posfair.fairness.language_tables` (the lead x later grid of β2 per
(lead, later) pair, the monolingual baselines on the diagonal, and the tables of this module's regressions).
This module fits:

* :func:`fit_language_ols` / :func:`language_effects` - the *language effect at equal
  position*: one regression pooled over every instance of a given n, on the later segments
  (positions 2..n) only::

      y = b0 + sum_{L != ref} c_L 1{later language = L} + sum_{p=3..n} d_p 1{position = p}
             + sum_{K != ref} e_K 1{lead language = K} (+ g * (tokens - mean tokens))

  ``c_L`` is the difference of a later segment in language ``L`` to one in the reference
  language at the same position and under the same lead language.  Without mixed instances
  (monolingual ones only) the lead language is the later one and its dummies are left out
  (``lead_controls`` False).  Standard errors are CR1
  cluster-robust, clustered as the audit's inference says (default ``conservative``: per term the
  wider interval of two-way set+topic and connected-component clustering, each with its own G --
  the instances of a grid draw their sets from the same topics, so sets of different instances
  share topics; see :mod:`posfair.stats.clusters`), p-values from t(G-1).  With ``control_length`` the segment's own
  token count (centred) enters too, so that a language whose script tokenises into more
  pieces is not mistaken for a language effect; :func:`segment_tokens` gives the mean tokens
  per segment per language to read beside the effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from posfair.fairness.experiment import STOCK_LABEL
from posfair.runtime.errors import PosfairInputError
from posfair.stats.clusters import Kind, fit_clustered
from posfair.stats.inference import Inference, InferenceLabel, significance_mark

__all__ = [
    "LanguageOLS",
    "fit_language_ols",
    "language_design",
    "language_effects",
    "segment_tokens",
    "has_language_grid",
    "default_reference",
]


def default_reference(langs: Sequence[str]) -> str:
    """The reference language of the pooled regression: English when present, else the first in sorted order."""
    langs = sorted(set(langs))
    return "en" if "en" in langs else langs[0]


@dataclass(frozen=True)
class LanguageOLS:
    """The pooled language regression of one (calibration, setting, measure, n)."""

    n: int
    reference: str
    names: list[str]
    params: np.ndarray
    bse: np.ndarray
    tvalues: np.ndarray
    pvalues: np.ndarray
    nobs: int
    n_clusters: int
    control_length: bool
    lead_controls: bool = True
    cluster_by: str = ""
    inference_used: InferenceLabel | None = None  # the inference of its p-values, typed
    result: Any = field(default=None, compare=False, repr=False)
    G: np.ndarray | None = None  # per term (None: n_clusters for every term)
    clusters_used: tuple[str, ...] | None = None  # per term what a cluster is in its interval (None: cluster_by)
    kinds_used: tuple[Kind, ...] | None = None  # per term the same in one word: "sets", "components", "two-way"
    ci: np.ndarray | None = None  # (terms, 2) 95 % intervals, t(G-1)

    @property
    def inference(self) -> str:
        """The short label of :attr:`inference_used` (``CR1 conservative t(G-1)``), the text a saved table holds."""
        return self.inference_used.text() if self.inference_used is not None else ""

    def to_frame(self) -> pd.DataFrame:
        kind = [nm.split(":", 1)[0] for nm in self.names]
        level = [nm.split(":", 1)[1] if ":" in nm else "" for nm in self.names]
        return pd.DataFrame(
            {
                "term": self.names,
                "kind": kind,
                "level": level,
                "estimate": self.params,
                "se": self.bse,
                "t": self.tvalues,
                "p": self.pvalues,
                "mark": [significance_mark(p) for p in self.pvalues],
                "nobs": self.nobs,
                "clusters": self.G if self.G is not None else self.n_clusters,
                "cluster_by": list(self.clusters_used) if self.clusters_used is not None else self.cluster_by,
                "inference": self.inference,
                "inference_used": self.inference_used,  # typed, in memory only (language_effects.csv: the text)
                "ci_low": self.ci[:, 0] if self.ci is not None else np.nan,
                "ci_high": self.ci[:, 1] if self.ci is not None else np.nan,
                "reference": self.reference,
                "length_adjusted": self.control_length,
                "lead_controls": self.lead_controls,
            }
        )


def language_design(
    frame: pd.DataFrame, n: int, reference: str, control_length: bool, lead_controls: bool = True
) -> tuple[np.ndarray, list[str]]:
    """Design matrix and term names of the pooled regression (rows: later segments of one n).

    Terms: ``intercept``, ``later:<L>`` for every later language but the reference,
    ``position:<p>`` for p = 3..n, ``lead:<K>`` for every lead language but the reference,
    and ``tokens`` (the segment's token count minus its mean) with ``control_length``.
    """
    later = frame["lang"].astype(str).to_numpy()
    lead = frame["lead_lang"].astype(str).to_numpy()
    pos = frame["position"].to_numpy(dtype=np.int64)
    cols, names = [np.ones(len(frame))], ["intercept"]
    for lang in sorted(set(later) - {reference}):
        cols.append((later == lang).astype(float))
        names.append(f"later:{lang}")
    for p in range(3, n + 1):
        cols.append((pos == p).astype(float))
        names.append(f"position:{p}")
    for lang in sorted(set(lead) - {reference}) if lead_controls else ():
        cols.append((lead == lang).astype(float))
        names.append(f"lead:{lang}")
    if control_length:
        tok = frame["seg_tokens"].to_numpy(dtype=float)
        cols.append(tok - tok.mean())
        names.append("tokens")
    return np.column_stack(cols), names


def fit_language_ols(
    observations: pd.DataFrame,
    *,
    n: int,
    measure: str = "sigma",
    calibration: str = STOCK_LABEL,
    setting: str = "main",
    reference: str | None = None,
    control_length: bool = False,
    clusters: str = Inference().clusters,
) -> LanguageOLS:
    """The pooled language regression (module docstring) on the later segments of every instance with ``n``.

    ``clusters``: ``"conservative"`` (default: per term the wider of two-way and component clustering),
    ``"set+topic"``, ``"set"`` or ``"component"`` (:func:`posfair.stats.clusters.fit_clustered`).
    """
    o = observations
    g = o[(o["calibration"] == calibration) & (o["setting"] == setting) & (o["n"] == n) & (o["position"] >= 2)]
    g = g[np.isfinite(g[measure].to_numpy(dtype=float))]
    if not len(g):
        raise KeyError(f"no {measure} observations at positions >= 2 for {calibration}/{setting}/n={n}")
    langs = sorted(set(g["lang"].astype(str)))
    if len(langs) < 2:
        raise PosfairInputError(
            f"the pooled language regression needs later segments in at least 2 languages; n={n} has {langs}"
        )
    reference = reference or default_reference(langs)
    if reference not in langs:
        raise PosfairInputError(f"reference language {reference!r} has no later segments (n={n}); languages: {langs}")
    lead_controls = True
    X, names = language_design(g, n, reference, control_length)
    rank = np.linalg.matrix_rank(X)
    if rank < X.shape[1]:  # e.g. only monolingual instances: the lead language is the later one, no separate control
        lead_controls = False
        X, names = language_design(g, n, reference, control_length, lead_controls=False)
        rank = np.linalg.matrix_rank(X)
    if rank < X.shape[1]:
        raise PosfairInputError(
            f"the pooled language regression (n={n}) is not identified: {X.shape[1]} terms but rank {rank} "
            "(language and position dummies collinear; use a full language grid)"
        )
    y = g[measure].to_numpy(dtype=float)
    fit = fit_clustered(y, X, g["set_id"].to_numpy(), g["topic"].to_numpy() if "topic" in g else None, clusters)
    return LanguageOLS(
        n=int(n),
        reference=reference,
        names=names,
        params=fit.params,
        bse=fit.bse,
        tvalues=fit.tvalues,
        pvalues=fit.pvalues,
        nobs=len(y),
        n_clusters=fit.n_clusters,
        control_length=control_length,
        lead_controls=lead_controls,
        cluster_by=fit.cluster_by(),
        inference_used=Inference(clusters=clusters).used(),
        result=fit.result,
        G=fit.G,
        clusters_used=fit.clusters,
        kinds_used=fit.kinds,
        ci=fit.ci,
    )


def has_language_grid(observations: pd.DataFrame) -> bool:
    """Whether the observations hold later segments (positions >= 2) in at least 2 languages."""
    if not len(observations) or "lang" not in observations:
        return False
    later = observations.loc[observations["position"] >= 2, "lang"]
    return later.nunique() >= 2


def language_effects(
    observations: pd.DataFrame,
    *,
    measure: str = "sigma",
    reference: str | None = None,
    clusters: str = Inference().clusters,
) -> pd.DataFrame:
    """The later-language terms of the pooled regression per (calibration, n), plain and length-adjusted.

    One row per (calibration, n, length_adjusted, language), the reference language with
    estimate 0 (``is_reference``); columns of :meth:`LanguageOLS.to_frame` plus ``calibration``,
    ``n``, ``language``.  Main setting only.
    """
    rows = []
    obs = observations[observations["setting"] == "main"]
    for (cal, n), _g in obs.groupby(["calibration", "n"], sort=False):
        for adjusted in (False, True):
            fit = fit_language_ols(
                obs,
                n=int(n),
                measure=measure,
                calibration=cal,
                reference=reference,
                control_length=adjusted,
                clusters=clusters,
            )
            f = fit.to_frame()
            f = f[f["kind"] == "later"].assign(language=lambda d: d["level"], is_reference=False)
            ref = f.iloc[:1].copy() if len(f) else None
            if ref is not None:
                ref = ref.assign(
                    term=f"later:{fit.reference}",
                    level=fit.reference,
                    language=fit.reference,
                    estimate=0.0,
                    se=np.nan,
                    t=np.nan,
                    p=np.nan,
                    mark="",
                    ci_low=np.nan,
                    ci_high=np.nan,
                    is_reference=True,
                )
                f = pd.concat([ref, f], ignore_index=True)
            f["calibration"] = cal
            f["n"] = int(n)
            f["measure"] = measure
            rows.append(f)
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True)


def segment_tokens(observations: pd.DataFrame) -> pd.DataFrame:
    """Mean, median and count of tokens per distinct segment, per language (model tokenizer, no special tokens)."""
    obs = observations[(observations["calibration"] == STOCK_LABEL) & (observations["setting"] == "main")]
    seg = obs.drop_duplicates("segment_id")
    out = seg.groupby("lang")["seg_tokens"].agg(["mean", "median", "count"]).reset_index()
    return out.rename(
        columns={"lang": "language", "mean": "mean_tokens", "median": "median_tokens", "count": "segments"}
    )
