"""Language bias across languages: the lead x later grid of β2 and the pooled language regression.

An audit over :func:`posfair.fairness.documents.language_grid` (every monolingual baseline and
every mixed configuration ``[lead, later, ..., later]``) yields, per instance, the usual
positional OLS; this module reads two things from it:

* :func:`beta2_grid` - β2 of σ (position 2 vs position 1) per (lead, later) pair, the
  monolingual baselines on the diagonal, with marks and G;
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
  share topics; see :mod:`posfair.fairness.clusters`), p-values from t(G-1).  With ``control_length`` the segment's own
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

from posfair.errors import PosfairInputError
from posfair.fairness.audit_tables import format_estimate
from posfair.fairness.clusters import cluster_kind, fit_clustered
from posfair.fairness.experiment import STOCK_LABEL
from posfair.fairness.ols import FEW_CLUSTERS, MARK_LEGEND, Inference, describe_inference, significance_mark
from posfair.report.tables import Table

__all__ = [
    "LanguageOLS",
    "fit_language_ols",
    "language_effects",
    "beta2_grid",
    "segment_tokens",
    "has_language_grid",
    "language_effect_table",
    "beta2_table",
    "calibration_effect_table",
    "default_reference",
    "LANGUAGE_INFERENCE",
]

LANGUAGE_INFERENCE = Inference().label()
#: measures of the language-effect tables besides σ
MEASURE_NAMES = {"sigma": "σ", "margin": "the margin (σ minus the mean cosine to other sets)"}


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
    inference: str = ""
    result: Any = field(default=None, compare=False, repr=False)
    G: np.ndarray | None = None  # per term (None: n_clusters for every term)
    clusters_used: tuple[str, ...] | None = None  # per term what a cluster is in its interval (None: cluster_by)
    ci: np.ndarray | None = None  # (terms, 2) 95 % intervals, t(G-1)

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
    ``"set+topic"``, ``"set"`` or ``"component"`` (:func:`posfair.fairness.clusters.fit_clustered`).
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
    labels = list(dict.fromkeys(fit.clusters))
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
        cluster_by=labels[0] if len(labels) == 1 else "; ".join(f"{cluster_kind(c)}: {c}" for c in labels),
        inference=Inference(clusters=clusters).label(),
        result=fit.result,
        G=fit.G,
        clusters_used=fit.clusters,
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


def beta2_grid(
    coefficients: pd.DataFrame, *, calibration: str = STOCK_LABEL, n: int, measure: str = "sigma"
) -> pd.DataFrame:
    """β2 per (lead, later) for one calibration and n: columns ``lead, later, estimate, p, mark, clusters``.

    The monolingual baselines have ``lead == later``.  Read from the per-instance regressions
    (``coefficients`` of an audit, main setting).
    """
    c = coefficients
    c = c[
        (c["measure"] == measure)
        & (c["calibration"] == calibration)
        & (c["setting"] == "main")
        & (c["n"] == n)
        & (c["position"] == 2)
    ]
    keys = c["config_key"].astype(str)
    lead = [k.split("-", 1)[0] for k in keys]
    later = [k.split("-", 1)[1] if "-" in k else k for k in keys]
    return pd.DataFrame(
        {
            "lead": lead,
            "later": later,
            "estimate": c["estimate"].to_numpy(),
            "p": c["p"].to_numpy(),
            "mark": c["mark"].to_numpy(),
            "clusters": c["clusters"].to_numpy(),
        }
    )


def grid_matrices(
    grid: pd.DataFrame, langs: Sequence[str], digits: int = 3, clusters: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(values, cell labels) of a :func:`beta2_grid` as lead x later matrices (NaN / "" where absent); with
    ``clusters`` each label carries its instance's G (clusters) on a second line."""
    values = pd.DataFrame(np.nan, index=list(langs), columns=list(langs))
    labels = pd.DataFrame("", index=list(langs), columns=list(langs))
    for r in grid.itertuples(index=False):
        if r.lead in values.index and r.later in values.columns:
            values.loc[r.lead, r.later] = r.estimate
            label = format_estimate(r.estimate, r.mark, digits)
            labels.loc[r.lead, r.later] = f"{label}\nG={int(r.clusters)}" if clusters else label
    values.index.name, values.columns.name = "lead", "later"
    labels.index.name, labels.columns.name = "lead", "later"
    return values, labels


def grid_languages(observations: pd.DataFrame) -> list[str]:
    """The languages of the grid: every lead and later language, sorted."""
    return sorted(set(observations["lead_lang"].astype(str)) | set(observations["later_lang"].astype(str)))


GRID_CAPTION = (
    "β2 of σ (position 2 vs position 1) per instance: rows the lead language (position 1), columns the later language "
    "(positions 2..n); the diagonal holds the monolingual baselines. Negative = the later segments are represented "
    "less than the lead segment. {legend}. G: segment sets per instance ({g})."
)


def beta2_table(
    coefficients: pd.DataFrame, observations: pd.DataFrame, *, calibration: str, n: int, model: str
) -> Table:
    """The lead x later grid of β2 (with marks) as a table, G in the caption."""
    grid = beta2_grid(coefficients, calibration=calibration, n=n)
    _, labels = grid_matrices(grid, grid_languages(observations))
    g = grid["clusters"]
    gtext = (
        f"G = {int(g.min())}"
        if len(g) and g.min() == g.max()
        else (f"G = {int(g.min())}..{int(g.max())}" if len(g) else "no instance")
    )
    few = (
        f"; fewer than {FEW_CLUSTERS} segment sets per instance: marks approximate"
        if len(g) and g.min() < FEW_CLUSTERS
        else ""
    )
    return Table(
        f"{model}, {calibration}: β2 of σ, lead x later language (n = {n})",
        labels,
        GRID_CAPTION.format(legend=MARK_LEGEND, g=gtext + few),
        f"language_beta2_n{n}_{_safe(calibration)}",
    )


def _safe(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in s)


def language_effect_table(effects: pd.DataFrame, tokens: pd.DataFrame, *, n: int, model: str) -> Table:
    """Language effects at equal position per calibration (plain and length-adjusted) beside mean tokens per segment."""
    e = effects[effects["n"] == n]
    langs = list(dict.fromkeys(e.sort_values(["is_reference", "language"], ascending=[False, True])["language"]))
    frame = pd.DataFrame(index=pd.Index(langs, name="later language"))
    tok = tokens.set_index("language")
    frame["mean tokens / segment"] = [f"{tok.loc[lg, 'mean_tokens']:.1f}" if lg in tok.index else "" for lg in langs]
    for cal in dict.fromkeys(e["calibration"]):
        for adjusted, suffix in ((False, ""), (True, " (length-adj.)")):
            sub = e[(e["calibration"] == cal) & (e["length_adjusted"] == adjusted)].set_index("language")
            frame[f"{cal}{suffix}"] = [
                (
                    "0 (ref.)"
                    if sub.loc[lg, "is_reference"]
                    else format_estimate(sub.loc[lg, "estimate"], sub.loc[lg, "mark"], 3)
                )
                if lg in sub.index
                else ""
                for lg in langs
            ]
    g = e["clusters"]
    ref = e.loc[e["is_reference"], "language"].iloc[0] if e["is_reference"].any() else ""
    measure = str(e["measure"].iloc[0]) if len(e) else "sigma"
    what = "σ" if measure == "sigma" else MEASURE_NAMES.get(measure, measure)
    caption = (
        f"Effect of the later segments' language on {what} at equal position, relative to {ref}: pooled OLS over every "
        f"instance with n = {n} on positions 2..{n}, with later-language, position and "
        f"{'lead-language dummies' if e['lead_controls'].all() else 'lead-language dummies (left out where collinear: monolingual instances only)'} "
        "(length-adj.: plus the segment's centred token count). "
        f"{MARK_LEGEND}. Inference: {describe_inference(e['inference'] if 'inference' in e else [LANGUAGE_INFERENCE])}; "
        f"{_clusters_text(e)}, N = {int(e['nobs'].max()) if len(e) else 0} later segments. Mean tokens per segment: the model's "
        "tokenizer, no special tokens, each distinct segment once."
    )
    if len(g) and g.max() < FEW_CLUSTERS:
        caption += f" Fewer than {FEW_CLUSTERS} clusters: p-values approximate."
    if measure == "margin":
        caption += (
            " The margin subtracts the document's mean cosine to the other segment sets' segments: a language whose texts "
            "all lie close together in the embedding space raises σ without being represented better, not the margin."
        )
    suffix = "" if measure == "sigma" else f"_{measure}"
    return Table(
        f"{model}: language effect on {what} at equal position (n = {n})",
        frame,
        caption,
        f"language_effects{suffix}_n{n}",
    )


def _clusters_text(e: pd.DataFrame) -> str:
    """``G = 200 clusters (sets (...))`` -- or, where the languages' intervals used different clusterings, each
    clustering with its G and the languages that used it."""
    e = e[~e["is_reference"]] if "is_reference" in e else e
    if not len(e):
        return "G = 0 clusters"
    if "cluster_by" not in e:
        return f"G = {int(e['clusters'].max())} clusters"
    if e[["clusters", "cluster_by"]].drop_duplicates().shape[0] == 1:
        return f"G = {int(e['clusters'].iloc[0])} clusters ({e['cluster_by'].iloc[0]})"
    parts = []
    for (G, by), g in e.groupby(["clusters", "cluster_by"], sort=False):
        cells = [
            f"{', '.join(sorted(set(c['language'])))} ({cal}{', length-adj.' if adj else ''})"
            for (cal, adj), c in g.groupby(["calibration", "length_adjusted"], sort=False)
        ]
        parts.append(f"G = {int(G)}, {by}: {'; '.join(cells)}")
    return "each interval under the wider clustering -- " + " | ".join(parts)


def calibration_effect_table(coefficients: pd.DataFrame, effects: pd.DataFrame, *, model: str) -> Table:
    """Per calibration and n: mean β2 over the mixed and the monolingual cells, mean |β2|, and the spread of the language effects."""
    c = coefficients[
        (coefficients["measure"] == "sigma") & (coefficients["setting"] == "main") & (coefficients["position"] == 2)
    ]
    rows = []
    for (cal, n), g in c.groupby(["calibration", "n"], sort=False):
        keys = g["config_key"].astype(str)
        mixed = g[keys.str.contains("-")]
        mono = g[~keys.str.contains("-")]
        e = (
            effects[(effects["calibration"] == cal) & (effects["n"] == n) & (~effects["length_adjusted"])]
            if len(effects)
            else effects
        )
        spread = float(e["estimate"].max() - e["estimate"].min()) if len(e) else np.nan
        rows.append(
            {
                "calibration": cal,
                "n": int(n),
                "mean β2 mixed": f"{mixed['estimate'].mean():.3f}" if len(mixed) else "",
                "mean β2 monolingual": f"{mono['estimate'].mean():.3f}" if len(mono) else "",
                "mean |β2| (all cells)": f"{g['estimate'].abs().mean():.3f}",
                "significant cells": f"{int((g['p'] < 0.05).sum())} of {len(g)}",
                "language-effect spread (max - min)": f"{spread:.3f}" if np.isfinite(spread) else "",
            }
        )
    frame = pd.DataFrame(rows).set_index(["calibration", "n"]) if rows else pd.DataFrame()
    caption = (
        "How each calibration changes the language grid: the mean of β2 over the mixed and the monolingual instances, "
        "the mean |β2| over all cells, how many cells have p < 0.05, and the spread of the pooled language effects."
    )
    return Table(f"{model}: language grid per calibration", frame, caption, "language_calibrations")
