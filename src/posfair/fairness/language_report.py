"""The audit report's language section: β2 heatmaps per calibration, the pooled language effects, tokens per language.

Added to an audit's report and files when its observations hold later segments in at least
two languages (:func:`posfair.fairness.language.has_language_grid`), e.g. after
``posfair audit --language-grid ...``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from posfair.fairness.analysis import saved_table
from posfair.fairness.experiment import STOCK_LABEL
from posfair.fairness.language import has_language_grid, language_effects, segment_tokens
from posfair.fairness.language_tables import (
    beta2_grid,
    beta2_table,
    calibration_effect_table,
    grid_languages,
    grid_matrices,
    language_effect_table,
)
from posfair.files.atomic import atomic_write_text
from posfair.report.html import FigureRef, Section, render_string
from posfair.report.plots import display_labels, heatmaps, relabel, save_figure
from posfair.report.tables import Table, to_html, write_table
from posfair.stats.inference import MARK_LEGEND

if TYPE_CHECKING:
    from posfair.fairness.findings import AuditFindings

__all__ = ["language_tables", "language_section", "save_language", "LANGUAGE_ALT"]

log = logging.getLogger(__name__)

LANGUAGE_ALT = "language: β2 heatmap"

_SECTION = """\
<p>Language bias: for every lead language (position 1) and later language (positions 2..n), β<sub>2</sub> of σ \
per instance (heatmaps, one panel per calibration; the diagonal holds the monolingual baselines), and the effect of \
the later segments' language at equal position from one regression pooled over all instances (language, position \
and lead-language dummies; each interval clustered as its caption says). Scripts tokenise differently: the mean tokens per segment \
per language stand beside the effects, and the length-adjusted columns add the segment's token count to the \
regression. The same regression on the margin (σ minus the document's mean cosine to the other segment sets) \
separates a language being represented from its texts merely lying close together. {{ legend }}.</p>
{% for t in tables %}{{ t | safe }}
{% endfor %}"""


def language_tables(result: AuditFindings) -> list[Table]:
    """Grid tables (per calibration and n), the language effects per n, the per-calibration summary."""
    obs = result.observations
    if not has_language_grid(obs):
        return []
    name = result.model["name"]
    clusters = result.inference.clusters
    effects = language_effects(obs, clusters=clusters)
    margin = language_effects(obs, measure="margin", clusters=clusters) if _has(obs, "margin") else None
    tokens = segment_tokens(obs)
    out = [calibration_effect_table(result.coefficients, effects, model=name)]
    for n in sorted(obs["n"].unique()):
        out.append(language_effect_table(effects, tokens, n=int(n), model=name))
        if margin is not None:
            out.append(language_effect_table(margin, tokens, n=int(n), model=name))
        for cal in dict.fromkeys(obs["calibration"]):
            out.append(beta2_table(result.coefficients, obs, calibration=cal, n=int(n), model=name))
    return out


def _has(obs, column: str) -> bool:
    return column in obs and bool(np.isfinite(obs[column].to_numpy(dtype=float)).any())


def _figure(result: AuditFindings, n: int):
    obs = result.observations
    langs = grid_languages(obs)
    panels = []
    names = display_labels(result.figure_labels())  # the prior's digest left out (Calibration.figure_label)
    for cal in dict.fromkeys(obs["calibration"]):
        values, labels = grid_matrices(beta2_grid(result.coefficients, calibration=cal, n=n), langs, clusters=True)
        panels.append((names[cal] if cal != STOCK_LABEL else "stock", values, labels))
    return heatmaps(
        panels,
        xlabel="later language",
        ylabel="lead language",
        colorbar="β2 of σ",
        title=f"β2 of σ (position 2 vs 1) per lead and later language, n = {n}",
        subtitle=relabel(result.figure_subtitle(), names),
    )


def language_section(result: AuditFindings, figures: list[FigureRef] | None = None) -> Section | None:
    """The report section (None when the audit holds no language grid)."""
    tables = language_tables(result)
    if not tables:
        return None
    html = render_string(_SECTION, legend=MARK_LEGEND, tables=[to_html(t) for t in tables])
    return Section("Languages", html, figures=[f for f in (figures or []) if f.alt == LANGUAGE_ALT])


def save_language(result: AuditFindings, out: Path) -> tuple[dict[str, Path], list[FigureRef]]:
    """Write the language tables, ``language_effects.csv`` and the heatmaps; (paths, figures for the report)."""
    paths: dict[str, Path] = {}
    figures: list[FigureRef] = []
    if not has_language_grid(result.observations):
        return paths, figures
    for t in language_tables(result):
        for kind, p in write_table(t, out / "tables").items():
            paths[f"table:{t.name}.{kind}"] = p
    clusters = result.inference.clusters
    frames = [language_effects(result.observations, clusters=clusters)]
    if _has(result.observations, "margin"):
        frames.append(language_effects(result.observations, measure="margin", clusters=clusters))
    paths["language_effects"] = atomic_write_text(
        out / "language_effects.csv", saved_table(pd.concat(frames, ignore_index=True)).to_csv(index=False)
    )
    for n in sorted(result.observations["n"].unique()):
        stem = out / "figures" / f"language_beta2_n{int(n)}"
        png = save_figure(_figure(result, int(n)), stem)
        paths[f"figure:language_n{int(n)}"] = stem.with_suffix(".png")
        figures.append(
            FigureRef(
                png, f"β2 of σ per lead x later language, n = {int(n)}, one panel per calibration.", alt=LANGUAGE_ALT
            )
        )
    return paths, figures
