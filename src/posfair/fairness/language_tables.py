"""The language grid's tables: β2 per (lead, later) pair as a lead x later grid (:func:`beta2_table`), the pooled
language effects beside mean tokens per segment (:func:`language_effect_table`), and each calibration's change of the
grid (:func:`calibration_effect_table`).  The regressions they read are :mod:`posfair.fairness.language`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from posfair.fairness.analysis import inference_labels
from posfair.fairness.audit_tables import format_estimate
from posfair.fairness.experiment import STOCK_LABEL
from posfair.report.tables import Table
from posfair.stats.inference import FEW_CLUSTERS, MARK_LEGEND, Inference, describe_inference

__all__ = [
    "beta2_grid",
    "beta2_table",
    "calibration_effect_table",
    "grid_languages",
    "grid_matrices",
    "language_effect_table",
    "LANGUAGE_INFERENCE",
]

LANGUAGE_INFERENCE = Inference().used()
#: measures of the language-effect tables besides σ
MEASURE_NAMES = {"sigma": "σ", "margin": "the margin (σ minus the mean cosine to other sets)"}


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
        f"{MARK_LEGEND}. Inference: {describe_inference(inference_labels(e) or [LANGUAGE_INFERENCE])}; "
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
