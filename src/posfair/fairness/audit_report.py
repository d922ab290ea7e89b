"""The audit's figures, HTML report sections and files on disk (what :meth:`AuditResult.save` writes).

Functions of an audit's :class:`~posfair.fairness.findings.AuditFindings` (never of the result that holds these
methods: :mod:`posfair.fairness.audit_result` imports this module, not the other way); the generic
rendering (page assembly, tables, profile grids, saving figures) is the
:mod:`posfair.report` package's.  The section markup is kept here as Jinja
template strings, rendered with autoescaping by :func:`posfair.report.html.render_string`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from posfair.calibration import Calibration
from posfair.calibration.coverage import NOOP_LABEL
from posfair.corpus.aligned import corpus_title
from posfair.fairness.analysis import coverage_messages, saved_table
from posfair.fairness.audit_tables import config_label, coverage_table, fidelity_table, headline_table
from posfair.fairness.experiment import STOCK_LABEL
from posfair.fairness.family_report import family_section, save_families
from posfair.fairness.language_report import LANGUAGE_ALT, language_section, save_language
from posfair.files.atomic import atomic_write_json, atomic_write_parquet, atomic_write_text
from posfair.files.run_folder import RunFolder
from posfair.report.html import FigureRef, Section, key_value_html, render_string, write_report
from posfair.report.plots import (
    ProfileSeries,
    display_labels,
    profile_grid,
    relabel,
    save_figure,
    tradeoff_scatter,
)
from posfair.report.tables import Table, shared_caption, to_html, to_markdown, write_table
from posfair.stats.inference import MARK_LEGEND

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from posfair.fairness.findings import AuditFindings

__all__ = ["profile_figure", "fidelity_figure", "report_sections", "save_result", "FIDELITY_ALT"]

log = logging.getLogger(__name__)

FIDELITY_ALT = "fidelity: σ profile spread against own-segment recall"
COLORS = ("#1f4e9c", "#b2182b", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


# -- figures ---------------------------------------------------------------------------------------
def config_title(config: str, n: int | None = None) -> str:
    """A language configuration as a figure names it, as the tables do: ``en``; a mixed one for one ``n`` as
    :func:`~posfair.fairness.documents.config_label` writes it (``[de, en, en]``), and where the panel spans
    several ``n`` by its own name (``[de, en, ..., en]``)."""
    return config_label(config, n)


def _names(result: AuditFindings) -> dict[str, str]:
    return display_labels(result.figure_labels())


def _subtitle(result: AuditFindings) -> str:
    return relabel(result.figure_subtitle(), _names(result))


def profile_figure(result: AuditFindings, setting: str = "main", title: str = "") -> Figure:
    """Mean sigma / tau per position with 95% intervals over segment sets; grid n x config; variants overlaid."""
    obs = result.observations
    rows, cols = sorted(obs["n"].unique()), result.configs
    names = _names(result)
    series = []
    variants = [(STOCK_LABEL, "main")] + [
        (cal, setting) for cal, s in result.variants if cal != STOCK_LABEL and s == setting
    ]
    noop = set(result.noop_calibrations())
    for k, (cal, s) in enumerate(variants):
        d = obs[(obs["calibration"] == cal) & (obs["setting"] == s)]
        label = names.get(cal, cal) if s == "main" else f"{names.get(cal, cal)} (control)"
        if cal in noop:  # identical to stock: named in the legend, not drawn over the stock line
            label += f" — {NOOP_LABEL}, = stock"
        for m, style in (("sigma", "-"), ("tau", "--")):
            if m in result.measures:
                data = pd.DataFrame(
                    {"row": d["n"], "col": d["config"], "x": d["position"], "value": d[m], "cluster": d["set_id"]}
                )
                series.append(
                    ProfileSeries(
                        f"{'σ' if m == 'sigma' else 'τ'} {label}",
                        data,
                        COLORS[k % len(COLORS)],
                        style,
                        draw=cal not in noop,
                    )
                )
    base = obs[(obs["calibration"] == STOCK_LABEL) & (obs["setting"] == "main")]
    bars = pd.DataFrame({"row": base["n"], "col": base["config"], "x": base["position"], "bar": base["seg_tokens"]})
    measures = " and ".join(x for m, x in (("sigma", "σ"), ("tau", "τ")) if m in result.measures)
    return profile_grid(
        series,
        rows=rows,
        cols=cols,
        bars=bars,
        row_label=lambda n: f"n = {n}",
        # a column spans every n of the grid: with one n, a mixed configuration is named for it ([de, en, en]), as the
        # tables, the terminal and the fidelity figure name it; with several, by its own name ([de, en, ..., en])
        col_label=lambda c: config_title(c, rows[0] if len(rows) == 1 else None),
        ylabel="cosine similarity",
        bar_label="mean tokens",
        title=title or f"{measures} per segment position",
        subtitle=_subtitle(result),
    )


def fidelity_figure(result: AuditFindings, setting: str = "main", title: str = "") -> Figure:
    """Profile spread of σ against own-segment recall@n, one point per variant and instance, stock marked."""
    fid = result.fidelity()
    fid = fid[(fid["setting"] == setting) | (fid["calibration"] == STOCK_LABEL)]
    names = _names(result)
    points = pd.DataFrame(
        {
            "panel": [f"n = {n}, {config_title(c, n)}" for n, c in zip(fid["n"], fid["config"], strict=True)],
            "label": [names.get(c, c) for c in fid["calibration"]],
            "x": fid["spread"],
            "y": fid["recall"],
            "reference": fid["calibration"] == STOCK_LABEL,
        }
    )
    return tradeoff_scatter(
        points,
        xlabel="σ profile spread (max - min over positions)",
        ylabel="own-segment recall@n",
        ybounds=(0.0, 1.0),
        title=title or "What flattening costs: σ spread against own-segment recall",
        subtitle=_subtitle(result),
    )


# -- HTML sections ---------------------------------------------------------------------------------
_INFERENCE = """\
{% if inference %}<p class="inference">Inference: {{ inference.rstrip(".") }}.</p>{% endif %}
{% if few %}<p class="warning">Few clusters: {{ few }}</p>{% endif %}
"""

_SUMMARY = """\
<p>Coefficients β<sub>p</sub> of the positional-fairness regression (σ, difference of position p to position 1; \
negative = later segments under-represented); G: the clusters the p-values rest on, per instance. {{ legend }}.</p>
<p>{{ model }}{% if limit %} · token limit {{ limit }}{% endif %}.{% for label, words in words %} <b>{{ label }}</b>: {{ words }}.{% endfor %}</p>
{{ inference | safe }}{{ headline | safe }}
{% for note in coverage_notes %}<p class="warning">{{ note }}</p>
{% endfor %}
{{ coverage | safe }}"""

_PROFILES = """\
<p>Mean σ (solid) and τ (dashed) per position with 95% intervals over segment sets; grey bars: mean segment \
length in tokens per position; rows: n, columns: language configuration.</p>"""

_TABLES = """\
{% if common %}<p class="inference">Every table below: {{ common }}</p>
{% else %}{{ inference | safe }}{% endif %}
{% for t in tables %}
{% if t.detail %}<details class="detail"><summary>{{ t.title }}</summary>{{ t.html | safe }}</details>{% else %}{{ t.html | safe }}{% endif %}
{% endfor %}"""

_FIDELITY = """\
<p>A flat σ profile can hide a collapse: if calibration makes every document embedding alike, each document \
is equally similar to its segments but no more than to anything else. The margin, own-segment recall and \
drift show what the flattening costs.</p>
{{ table | safe }}
{% if stock_only %}<p>Stock model only: no calibration to set against it, so no trade-off figure (add \
<code>--calibration default</code> to draw one).</p>{% endif %}"""

_DOCUMENTS = """\
{{ table | safe }}
{% for note in notes %}<p>{{ note }}</p>
{% endfor %}"""

_PARAMETERS = """\
<h3>Model</h3>{{ model | safe }}<h3>Corpus</h3>{{ corpus | safe }}<h3>Settings</h3>{{ settings | safe }}
<h3>Calibrations</h3>{% for label, words, spec in calibrations %}<p><b>{{ label }}</b>: {{ words }}</p><pre>{{ spec }}</pre>\
{% else %}<p>none: the stock model only</p>{% endfor %}
<h3>Timings (s)</h3>{{ timings | safe }}"""


def _words(calibration: dict) -> str:
    """A calibration of ``AuditResult.calibrations`` in words (e.g. "baskets of 128 tokens, the last 50% of layers, strength 0.5")."""
    return Calibration.from_dict({k: v for k, v in calibration.items() if k not in ("label", "key")}).describe()


def report_sections(
    result: AuditFindings, figures: list[FigureRef] | None = None, extra_sections: list[Section] | None = None
) -> list[Section]:
    """Summary, profiles, fidelity, OLS tables, documents, ``extra_sections``, run parameters."""
    figures = figures or []
    inference = render_string(_INFERENCE, inference=result.inference_text(), few=result.few_clusters_message())
    summary = _summary_section(result, inference)
    fig_section = Section("Profiles", render_string(_PROFILES), figures=[f for f in figures if f.alt != FIDELITY_ALT])
    tables = _tables_section(result)
    fidelity = []
    if result.has_fidelity:
        table = to_html(fidelity_table(result.fidelity(), result.model["name"]))
        fidelity = [
            Section(
                "Fidelity",
                render_string(_FIDELITY, table=table, stock_only=not result.calibrations),
                figures=[f for f in figures if f.alt == FIDELITY_ALT],
            )
        ]
    documents = _documents_section(result)
    params = _parameters_section(result)
    language = language_section(result, figures)
    fig_section.figures = [f for f in fig_section.figures if f.alt != LANGUAGE_ALT]
    return [
        summary,
        fig_section,
        *fidelity,
        *([language] if language else []),
        *([family] if (family := family_section(result)) else []),
        tables,
        documents,
        *(extra_sections or []),
        params,
    ]


def _summary_section(result: AuditFindings, inference: str) -> Section:
    """The headline table, the inference words and, with calibrations, the calibrated-share table."""
    hf = result.headline_frame()
    headline = to_html(
        headline_table(hf, "Headline: β_p (position p vs position 1) per instance")
        if len(hf)
        else Table("Headline: β_p (position p vs position 1) per instance", pd.DataFrame(), name="headline")
    )
    coverage = dict(coverage_notes=[], coverage="")
    if result.calibrations:  # the calibrated-share table, with a warning line per calibration that left documents stock
        cov = result.coverage()
        coverage = dict(
            coverage_notes=coverage_messages(cov), coverage=to_html(coverage_table(cov, result.model["name"]))
        )
    return Section(
        "Summary",
        render_string(
            _SUMMARY,
            legend=MARK_LEGEND,
            inference=inference,
            headline=headline,
            model=result.model["name"],
            limit=result.model.get("limit"),
            words=[(c["label"], _words(c)) for c in result.calibrations],
            **coverage,
        ),
    )


def _tables_section(result: AuditFindings) -> Section:
    """The OLS tables (fidelity and coverage have sections of their own), their shared words once above them."""
    coef_tables = [t for t in result.tables() if t.name not in ("fidelity", "coverage")]
    detail = [t.name.endswith("_detail") for t in coef_tables]
    # the method, inference and marks once above the tables, each table's own words under it
    common, captions = shared_caption([t.caption for t in coef_tables], among=[not d for d in detail])
    return Section(
        "OLS tables",
        render_string(
            _TABLES,
            inference=render_string(_INFERENCE, inference=result.inference_text(), few=None),  # few: the summary's
            common=common,
            tables=[
                dict(detail=d, title=t.title, html=to_html(t, caption=c))
                for t, d, c in zip(coef_tables, detail, captions, strict=True)
            ],
        ),
    )


def _documents_section(result: AuditFindings) -> Section:
    """The sampling per instance and its notes."""
    # the notes print under the table, "instance" repeats n and the configuration, an empty column (no families) goes
    sampling = pd.DataFrame(result.sampling).drop(columns=["notes", "instance"], errors="ignore")
    sampling = sampling.drop(columns=[c for c in sampling.columns if (sampling[c].isna() | (sampling[c] == "")).all()])
    if {"n", "config"} <= set(sampling.columns):  # each instance's configuration as the tables write it
        sampling["config"] = [config_label(c, n) for c, n in zip(sampling["config"], sampling["n"], strict=True)]
    sampling = sampling.rename(columns={"config": "configuration", "limit": "token limit"})
    return Section(
        "Documents",
        render_string(
            _DOCUMENTS,
            table=to_html(Table("Sampling per instance", sampling, name="sampling")),
            notes=[n for s in result.sampling for n in s.get("notes", [])],
        ),
    )


def _parameters_section(result: AuditFindings) -> Section:
    """The model, corpus, settings, each calibration (in words and as a spec) and the timings."""
    return Section(
        "Run parameters",
        render_string(
            _PARAMETERS,
            model=key_value_html(result.model),
            corpus=key_value_html(result.corpus),
            settings=key_value_html(result.settings),
            calibrations=[(c["label"], _words(c), json.dumps(c, sort_keys=True)) for c in result.calibrations],
            timings=key_value_html({k: f"{v:.1f}" for k, v in result.timings.items()}),
        ),
    )


# -- files -----------------------------------------------------------------------------------------
def save_result(
    result: AuditFindings,
    out_dir,
    *,
    extra_sections: list[Section] | None = None,
    title: str | None = None,
    state: Sequence[str | Path] = ("cache",),
) -> dict[str, Path]:
    """Write observations (Parquet), coefficients (CSV), tables (md/csv/tex), figures (png/pdf), report (HTML), run.json.

    The folder is a :class:`~posfair.files.run_folder.RunFolder` (``posfair-run.json`` lists the files written, an earlier
    audit's files that this one did not write are removed); ``state``: its sub-folders of resumable state (the
    embedding cache), left alone."""
    out = Path(out_dir)
    log.info("writing the audit to %s", out)
    # what the figures are made from, by content (not the model's or corpus's name or path)
    key = {
        "model": result.model.get("fingerprint"),
        "corpus": result.corpus.get("fingerprint"),
        "settings": result.settings,
        "calibrations": result.calibrations,
    }
    with RunFolder(out, "audit", key, state=state):
        return _write_result(result, out, extra_sections, title)


def _write_result(
    result: AuditFindings, out: Path, extra_sections: list[Section] | None, title: str | None
) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    paths["observations"] = atomic_write_parquet(out / "observations.parquet", result.observations)
    paths["coefficients"] = atomic_write_text(
        out / "coefficients.csv", saved_table(result.coefficients).to_csv(index=False)
    )
    for t in result.tables():
        for kind, p in write_table(t, out / "tables").items():
            paths[f"table:{t.name}.{kind}"] = p
    figures = []
    settings = ["main"] + (["control"] if any(s == "control" for _, s in result.variants) else [])
    for setting in settings:
        title_fig = "calibrated documents vs stock standalone segments (control)" if setting == "control" else ""
        png = save_figure(profile_figure(result, setting, title_fig), out / "figures" / f"profiles_{setting}")
        paths[f"figure:{setting}"] = out / "figures" / f"profiles_{setting}.png"
        cap = (
            "Semantic-fidelity control: calibrated documents against stock standalone segments, overlaid on the stock run."
            if setting == "control"
            else "Stock and calibrated runs (calibration applied to documents and standalone segments)."
            if result.calibrations
            else "The stock run (no calibration was asked for)."
        )
        figures.append(FigureRef(png, cap))
    if result.has_fidelity:
        paths["fidelity"] = atomic_write_text(out / "fidelity.csv", result.fidelity().to_csv(index=False))
    if result.has_fidelity and result.calibrations:  # stock only: no trade-off to draw (the section says so)
        png = save_figure(fidelity_figure(result), out / "figures" / "fidelity")
        paths["figure:fidelity"] = out / "figures" / "fidelity.png"
        figures.append(
            FigureRef(
                png,
                "σ profile spread against own-segment recall@n: one point per calibration, stock marked.",
                alt=FIDELITY_ALT,
            )
        )
    language_paths, language_figures = save_language(result, out)
    paths.update(language_paths)
    paths.update(save_families(result, out))
    figures += language_figures
    hf = result.headline_frame()
    few = result.few_clusters_message()
    caption = f"{MARK_LEGEND}. G: clusters. Inference: {result.inference_text()}." + (
        f" Few clusters: {few}" if few else ""
    )
    paths["headline"] = atomic_write_text(
        out / "headline.md",
        to_markdown(headline_table(hf, "β_p (σ, position p vs position 1), stock vs calibrated", caption))
        if len(hf)
        else "",
    )
    paths["run"] = atomic_write_json(
        out / "run.json",
        {
            "model": result.model,
            "corpus": result.corpus,
            "settings": result.settings,
            "calibrations": result.calibrations,
            "sampling": result.sampling,
            "timings": result.timings,
            "headline": result.headline(),
            "inference": result.inference_text(),
            # per coefficient: the clusters its interval and p-value rest on (G) and what a cluster is
            "intervals": [
                {k: (int(v) if k in ("n", "position", "clusters") else v) for k, v in r.items()}
                for r in result.coefficients[
                    ["calibration", "setting", "measure", "n", "config", "position", "clusters", "cluster_by"]
                ].to_dict("records")
            ],
        },
    )
    paths["report"] = write_report(
        out / "report.html",
        title or f"Positional-fairness audit: {result.model['name']}",
        report_sections(result, figures, extra_sections),
        subtitle=f"{corpus_title(result.corpus.get('name', ''))} · {len(result.observations):,} observations",
    )
    return paths
