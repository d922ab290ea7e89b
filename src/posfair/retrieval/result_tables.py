"""Result tables and the strength plot, in the layouts of Michail et al. (2026).

* :func:`group_table` - Table 1: rows = settings (stock, SEA, late chunking, then calibrations
  by layer set, strength, basket size), columns = per-group nDCG@10 (x100),
  Harm (x100), PSI, plus aggregate nDCG@10; the best setting by Harm is marked.
* :func:`bucket_table` - Table 2: PSI per length bucket with its change vs the
  stock model, and aggregate nDCG@10 with its change.
* :func:`results_table` - either table as a :class:`posfair.report.tables.Table`
  (formatted cells, rows indexed by section and setting), written like every posfair
  table by :func:`posfair.report.tables.write_table` (Markdown, CSV, LaTeX).
* :func:`to_markdown` - the Markdown of :func:`results_table` with the best setting in bold
  (what the command line prints); :func:`to_latex` - the paper's booktabs layout (section
  rows, the best setting in bold, alpha and Delta symbols).
* :func:`strength_figure` / :func:`plot_strength_curves` - Figure 3: per-group nDCG@10
  change vs strength (a ``matplotlib.figure.Figure``; pyplot's global state is not touched).

Both tables carry ``calibrated_share``: the fraction of the benchmark's documents
the setting's calibration changed (NaN, shown as "—", for stock and SEA).  A
calibration with share 0 is labelled "no-op: nothing calibrated" and its cells
are left empty: its figures would be the stock model's, not a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from posfair.calibration import Calibration
from posfair.calibration.coverage import NOOP_LABEL, SHARE_NAME
from posfair.files.atomic import atomic_write
from posfair.report import tables as report_tables
from posfair.report.plots import finish
from posfair.report.tables import Table
from posfair.retrieval.evaluator import RetrievalResult
from posfair.retrieval.groups import POSIR_BUCKETS

__all__ = [
    "group_table",
    "bucket_table",
    "results_table",
    "to_markdown",
    "to_latex",
    "strength_figure",
    "plot_strength_curves",
    "layer_section",
    "table_legend",
]


def layer_section(cal: Calibration) -> str:
    if cal.layers == 1:
        return "Last layer"
    if isinstance(cal.layers, float):
        return f"{cal.layers * 100:g}% of layers"
    if isinstance(cal.layers, int):
        return f"Last {cal.layers} layers"
    return "Layers " + ",".join(str(i) for i in cal.layers)


def _row_key(r: RetrievalResult) -> tuple[str, str, tuple]:
    """(section, setting, sort key) of a result.  The setting is the result's one name, :attr:`RetrievalResult.setting`
    (``stock``, ``SEA``, ``late-max (64-token windows)``, ``B128-L0.5-a0.5``), as in the differences table, the
    CSV and JSON files and the progress lines; the section (the paper's layer-set heading) is for LaTeX only."""
    setting = r.setting
    if r.method == "stock":
        return "", setting, (0,)
    if r.method == "sea":
        return "", setting, (1,)
    if r.method == "late":
        return "", setting, (1, setting)
    cal = Calibration.from_dict(r.calibration)
    layer_rank = 0 if cal.layers == 1 else 1
    return layer_section(cal), setting, (2, layer_rank, layer_section(cal), cal.strength, cal.basket_size, setting)


def _ordered(results: Sequence[RetrievalResult]) -> list[tuple[str, str, RetrievalResult]]:
    if not results:
        raise ValueError("no results to tabulate")
    names = {r.benchmark for r in results}
    if len(names) != 1:
        raise ValueError(f"one table per benchmark: results come from {sorted(names)}")
    rows = [(*_row_key(r), r) for r in results]
    rows.sort(key=lambda x: x[2])
    return [(section, setting, r) for section, setting, _, r in rows]


def _stock(results: Sequence[RetrievalResult]) -> RetrievalResult | None:
    return next((r for r in results if r.method == "stock"), None)


def _share(r: RetrievalResult) -> float:
    return math.nan if r.calibrated_share is None else float(r.calibrated_share)


def _shown(r: RetrievalResult) -> bool:
    """Whether a result's figures are presented (not for a no-op calibration or an unevaluated one)."""
    return not r.noop and r.evaluated


def group_table(results: Sequence[RetrievalResult]) -> pd.DataFrame:
    """Table 1 layout (nDCG@10 and Harm x100, two decimals; PSI three decimals)."""
    rows = _ordered(results)
    groups = next((list(r.groups) for _, _, r in rows if r.groups), [])
    if not groups:
        raise ValueError(f"benchmark {rows[0][2].benchmark!r} has no positional groups (use bucket_table)")
    data = []
    for section, setting, r in rows:
        row = {"section": section, "setting": setting}
        shown = _shown(r)
        row.update({g: round(100 * r.groups.get(g, math.nan), 2) if shown else math.nan for g in groups})
        row["Harm"] = round(100 * r.metrics["harm"], 2) if shown else math.nan
        row["PSI"] = round(r.metrics["psi"], 3) if shown else math.nan
        row["nDCG@10"] = round(100 * r.metrics["ndcg@10"], 2) if shown else math.nan
        row["calibrated_share"] = _share(r)
        data.append(row)
    df = pd.DataFrame(data)
    df["best"] = df["Harm"] == df["Harm"].max()
    return df


def bucket_table(results: Sequence[RetrievalResult]) -> pd.DataFrame:
    """Table 2 layout: PSI per length bucket (two decimals) and its change vs stock; nDCG@10 x100 and change."""
    rows = _ordered(results)
    stock = _stock(results)
    buckets = [b for b, _, _ in POSIR_BUCKETS if any(b in r.buckets for _, _, r in rows)]
    if not buckets:
        raise ValueError(f"benchmark {rows[0][2].benchmark!r} has no length buckets (use group_table)")
    has_harm = any("harm" in r.metrics for _, _, r in rows)
    data = []
    for section, setting, r in rows:
        row: dict[str, object] = {"section": section, "setting": setting}
        shown = _shown(r)
        for b in buckets:
            v = r.buckets.get(b, {}).get("psi", math.nan) if shown else math.nan
            row[f"PSI {b}"] = round(v, 3)
            base = stock.buckets.get(b, {}).get("psi", math.nan) if stock is not None and r is not stock else math.nan
            row[f"ΔPSI {b}"] = round(v - base, 3)
        row["nDCG@10"] = round(100 * r.metrics["ndcg@10"], 2) if shown else math.nan
        row["ΔnDCG@10"] = (
            round(100 * (r.metrics["ndcg@10"] - stock.metrics["ndcg@10"]), 2)
            if shown and stock is not None and r is not stock
            else math.nan
        )
        if has_harm:
            row["Harm"] = round(100 * r.metrics["harm"], 2) if shown and "harm" in r.metrics else math.nan
        row["calibrated_share"] = _share(r)
        data.append(row)
    df = pd.DataFrame(data)
    key = "Harm" if "Harm" in df.columns else "nDCG@10"
    df["best"] = df[key] == df[key].max()
    return df


def _fmt(v: object, col: str) -> str:
    if col == "calibrated_share":
        return "—" if v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)) else f"{float(v):.3f}"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "-"
        psi = col.startswith(("PSI", "ΔPSI"))  # PSI on its 0-1 scale: three decimals; x100 figures: two
        if col.startswith("Δ"):
            return f"{v:+.3f}" if psi else f"{v:+.2f}"
        return f"{v:.3f}" if psi else f"{v:.2f}"
    return str(v)


def _value_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in ("section", "setting", "best")]


def _best_column(df: pd.DataFrame) -> str:
    """The ``best`` flag's column name: what it is the highest of."""
    return "highest Harm" if "Harm" in df.columns and df["Harm"].notna().any() else "highest nDCG@10"


#: one line per column of the result tables (``{groups}``: the positional groups present)
_LEGEND = {
    "stock": "stock = no calibration",
    "SEA": "SEA = Segment Embed Average (segments embedded alone, vectors averaged)",
    "late": "late-<max|mean> (<chunks>) = late chunking, chunk vectors pooled by max or mean",
    "calibrated": "B<tokens>-L<layers>-a<strength> = calibrated attention: baskets of <tokens> tokens in the layers "
    "L<layers> names (Llast1: the last layer, Llast<k>: the last k, L0.5: the last half, Lall: every layer, "
    "L<i>+<j>: those, 0-based), strength <strength>",
    "groups": "{groups}: nDCG@10 (x100) of the queries whose answer lies in that positional group",
    "Harm": "Harm: harmonic mean of the groups' nDCG@10 (x100; higher = better and more even over positions)",
    "PSI": "PSI: position sensitivity, 1 - min / max of the groups' nDCG@10 (0-1; lower = less sensitive)",
    "PSI bucket": "PSI Q1..Q4: PSI within the documents of one length bucket (Q1: up to 512 tokens, Q2: 513-1024, "
    "Q3: 1025-1536, Q4: longer); not the same quantity as the positional groups' PSI",
    "ΔPSI bucket": "ΔPSI Qk: the setting's PSI Qk minus stock's",
    "nDCG@10": "nDCG@10: over all queries (x100)",
    "ΔnDCG@10": "ΔnDCG@10: the setting's nDCG@10 minus stock's (x100)",
    "calibrated_share": f"{SHARE_NAME}: fraction of the benchmark's documents the calibration changes (— for "
    "{uncalibrated}); a calibration with share 0 ({noop}) is not evaluated",
    "-": "-: not evaluated or not defined ({undefined})",
}

#: how the legend names the settings that calibrate nothing (the "—" of calibrated_share)
_UNCALIBRATED = {"stock": "stock", "SEA": "SEA", "late": "late chunking"}


def _words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def table_legend(df: pd.DataFrame) -> str:
    """What each column of a :func:`group_table` / :func:`bucket_table` frame means, one line per column."""
    cols = _value_columns(df)
    groups = [c for c in cols if c not in _LEGEND and not c.startswith(("PSI ", "ΔPSI "))]
    labels = [str(x) for x in df["setting"]]
    kinds = {"stock" if x == "stock" else "SEA" if x == "SEA" else "late" if x.startswith("late-") else "calibrated"
             for x in labels}  # fmt: skip
    lines = ["setting: " + "; ".join(_LEGEND[k] for k in ("stock", "SEA", "late", "calibrated") if k in kinds)]
    if groups:
        lines.append(_LEGEND["groups"].format(groups=", ".join(groups)))
    uncalibrated = [_UNCALIBRATED[k] for k in ("stock", "SEA", "late") if k in kinds] or ["no setting here"]
    seen = set()
    for c in cols:
        key = "PSI bucket" if c.startswith("PSI ") else "ΔPSI bucket" if c.startswith("ΔPSI ") else c
        if key in _LEGEND and key not in seen:
            seen.add(key)
            lines.append(_LEGEND[key].format(uncalibrated=_words(uncalibrated), noop=NOOP_LABEL))
    if "best" in df.columns:
        lines.append(f"{_best_column(df)}: yes on the setting with the highest {_best_column(df).split()[-1]}")
    figures = [c for c in cols if c != "calibrated_share"]
    if bool(df[figures].isna().any().any()):  # a "-" is in the table
        noop = "calibrated_share" in df.columns and bool((df["calibrated_share"] == 0).any())
        undefined = ["stock's own change"] if any(c.startswith("Δ") for c in cols) else []
        undefined += ["a no-op calibration"] if noop else []
        line = _LEGEND["-"].format(undefined=_words(undefined)) if undefined else "-: not evaluated or not defined"
        lines.append(line)
    return "\n".join(lines)


def results_table(
    df: pd.DataFrame, *, title: str = "", caption: str | None = None, name: str = "table", bold_best: bool = False
) -> Table:
    """A :func:`group_table` / :func:`bucket_table` frame as a report :class:`~posfair.report.tables.Table`.

    Rows are indexed by the setting's one name (:attr:`RetrievalResult.setting`); cells are formatted (x100
    figures and their changes with two decimals, PSI and its changes with three, ``-`` for a figure not
    presented, ``—`` for the calibrated share of stock, SEA and late chunking).  The best setting gets a
    ``highest Harm`` column ("yes"), or with ``bold_best`` its name and cells in Markdown bold (for Markdown
    only).  ``caption``: None = :func:`table_legend` (a line per column).
    """
    cols = _value_columns(df)
    best = df["best"].astype(bool).tolist() if "best" in df.columns else [False] * len(df)
    settings = df["setting"].astype(str).tolist()
    cells = {SHARE_NAME if c == "calibrated_share" else c: [_fmt(v, c) for v in df[c]] for c in cols}
    if bold_best:
        bold = lambda x, b: f"**{x}**" if b else x  # noqa: E731
        settings = [bold(x, b) for x, b in zip(settings, best, strict=True)]
        cells = {c: [bold(x, b) for x, b in zip(v, best, strict=True)] for c, v in cells.items()}
    elif "best" in df.columns:
        cells[_best_column(df)] = ["yes" if b else "" for b in best]
    index = pd.Index(settings, name="setting")
    return Table(title, pd.DataFrame(cells, index=index), table_legend(df) if caption is None else caption, name)


def to_markdown(df: pd.DataFrame, title: str = "") -> str:
    """Markdown of :func:`results_table` with the best setting (``best`` column) in bold."""
    return report_tables.to_markdown(results_table(df, title=title, bold_best=True))


def _tex(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
        s = s.replace(a, b)
    return s.replace("a=", r"$\alpha$=").replace("Δ", r"$\Delta$").replace("—", "---")


def to_latex(df: pd.DataFrame) -> str:
    """The paper's layout: a booktabs tabular with a row per section, the best setting in bold.

    Same cells as :func:`results_table`; the files a sweep writes use the common
    :func:`posfair.report.tables.to_latex` table instead.
    """
    frame = results_table(df).frame.drop(columns=["highest Harm", "highest nDCG@10"], errors="ignore")
    best = df["best"].astype(bool).tolist() if "best" in df.columns else [False] * len(df)
    sections = df["section"].fillna("").astype(str).tolist() if "section" in df.columns else [""] * len(df)
    cols = ["setting", *frame.columns]
    lines = [
        r"\begin{tabular}{l" + "r" * (len(cols) - 1) + "}",
        r"\toprule",
        " & ".join(_tex(c) for c in cols) + r" \\",
        r"\midrule",
    ]
    current = None
    for section, setting, row, is_best in zip(sections, frame.index, frame.itertuples(index=False), best, strict=True):
        if section and section != current:
            lines.append(rf"\multicolumn{{{len(cols)}}}{{l}}{{\textit{{{_tex(section)}}}}} \\")
        current = section or current
        cells = [_tex(c) for c in (setting, *row)]
        if is_best:
            cells = [rf"\textbf{{{c}}}" for c in cells]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def strength_figure(results: Sequence[RetrievalResult], basket_size: int | None = None):
    """Figure 3 as a ``matplotlib.figure.Figure``: nDCG@10 change vs the stock model (points: x100) per group
    (and Harm) against strength.

    One row of panels per basket size (``basket_size``: only that one; None: every basket size evaluated, so that
    every evaluated calibration is in the figure), one column per layer set; strength 0 is the stock model itself.
    Built without pyplot: no backend is chosen and nothing is registered with pyplot's figure manager.
    """
    from matplotlib.figure import Figure  # heavy, and only needed for the figure

    stock = _stock(results)
    if stock is None:
        raise ValueError("the strength plot needs the stock result")
    if not stock.groups:
        raise ValueError(f"benchmark {stock.benchmark!r} has no positional groups to plot")
    panels: dict[tuple[int, str], list[tuple[float, RetrievalResult]]] = {}
    for r in results:
        if r.method != "calibrated" or not _shown(r):  # a no-op point would draw the stock figures as a result
            continue
        cal = Calibration.from_dict(r.calibration)
        if basket_size is None or cal.basket_size == basket_size:
            panels.setdefault((cal.basket_size, layer_section(cal)), []).append((cal.strength, r))
    if not panels:
        raise ValueError(f"no calibrated result with basket size {basket_size}")
    baskets = sorted({b for b, _ in panels})
    sections = sorted({s for _, s in panels})
    fig = Figure(figsize=(5 * len(sections), 3.2 * len(baskets) + 0.6))
    axes = fig.subplots(len(baskets), len(sections), sharey=True, squeeze=False)
    for i, basket in enumerate(baskets):
        for j, section in enumerate(sections):
            ax = axes[i][j]
            if (basket, section) not in panels:
                ax.set_visible(False)
                continue
            pts = [(0.0, stock)] + sorted(panels[(basket, section)], key=lambda x: x[0])
            xs = [a for a, _ in pts]
            for g in stock.groups:
                ax.plot(xs, [100 * (r.groups[g] - stock.groups[g]) for _, r in pts], marker="o", ms=3, label=g)
            harm = [100 * (r.metrics["harm"] - stock.metrics["harm"]) for _, r in pts]
            ax.plot(xs, harm, "k--", lw=1.5, label="Harm")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_title(f"{section}, B={basket}", fontsize=9)
            ax.set_xlabel("strength", fontsize=8)
            if j == 0:
                ax.set_ylabel("nDCG@10 change vs stock\n(points, x100)", fontsize=8)
    handles, labels = next(ax for ax in axes.flat if ax.get_visible()).get_legend_handles_labels()
    sizes = ", ".join(map(str, baskets))
    words = f"baskets of {sizes} tokens (a row each), strength 0 = the stock model"
    head = " · ".join(x for x in (stock.model, f"token limit {stock.token_limit}" if stock.token_limit else "") if x)
    subtitle = " · ".join(x for x in (head, f"{len(stock.query_ids)} queries") if x) + f"\n{words}"  # words: the note
    finish(fig, title=f"nDCG@10 change against strength: {stock.benchmark}", subtitle=subtitle, handles=handles,
           labels=labels)  # fmt: skip
    return fig


def plot_strength_curves(results: Sequence[RetrievalResult], path: str | Path, basket_size: int | None = None) -> Path:
    """:func:`strength_figure` saved atomically to ``path`` (format from its suffix, PNG by default)."""
    fig = strength_figure(results, basket_size)
    path = Path(path)
    atomic_write(path, lambda p: fig.savefig(p, format=path.suffix.lstrip(".") or "png", dpi=150))
    return path
