"""Figures and the HTML report section of the attention profile.

* :func:`plot_baskets` — mean mass per absolute basket with 95% bands, the BOS and
  EOS keys in their own panel, every profile (e.g. stock vs calibrated) overlaid,
  the number of documents reaching each basket as grey bars;
* :func:`plot_view` — the same for the relative-position bins or the segment positions;
* :func:`plot_layer_heatmap` — layer x basket mean mass, one panel per profile,
  the averaged layer set marked;
* :func:`summary_html` — the headline numbers of each profile as a table;
* :func:`attention_section` — writes the figures and returns a
  :class:`posfair.report.html.Section` for a report (:func:`write_attention_report`
  writes it as a page of its own).

A calibrated profile in which no document was calibrated (every document
shorter than one basket, or exactly one) is the stock profile: it is named in
the legend as "no-op: nothing calibrated" but not drawn over the stock line; a
profile that calibrated only part of its documents carries its calibrated share
in its label.

This module exists to draw: matplotlib is imported with it (the profile itself,
:mod:`posfair.attention.profile`, does not need it).  Figures are built on
:class:`matplotlib.figure.Figure`, never through pyplot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from posfair.attention.profile import AttentionProfile
from posfair.calibration import Calibration
from posfair.calibration.coverage import NOOP_LABEL, SHARE_NAME, format_share
from posfair.report.html import FigureRef, Section, key_value_html, render_string, write_report
from posfair.report.plots import LEGEND_ONLY, finish, new_figure, save_figure

__all__ = [
    "plot_baskets",
    "plot_view",
    "plot_layer_heatmap",
    "save_attention_figures",
    "attention_section",
    "summary_html",
    "write_attention_report",
    "CAPTIONS",
]

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_XLABEL = {"basket": "content basket", "bin": "relative position in the document (bin)", "segment": "segment position"}


def _groups(profiles: Sequence[AttentionProfile]) -> list[str]:
    seen: list[str] = []
    for p in profiles:
        if p.group not in seen:
            seen.append(p.group)
    return seen


def _colors(profiles: Sequence[AttentionProfile]) -> dict[str, str]:
    labels: list[str] = []
    for p in profiles:
        if p.label not in labels:
            labels.append(p.label)
    return {lab: COLORS[i % len(COLORS)] for i, lab in enumerate(labels)}


def _name(p: AttentionProfile) -> str:
    """The profile's label as the figures name it (:meth:`Calibration.figure_label`: no prior digest); a label the
    caller chose, or stock's, as it is."""
    if p.calibration is None:
        return p.label
    cal = Calibration.from_dict(p.calibration)
    return cal.figure_label() if p.label == cal.label() else p.label


def _legend_label(p: AttentionProfile) -> str:
    """The profile's label, marked when its calibration calibrated nothing or only part of the documents."""
    if p.noop:
        return f"{_name(p)} — {NOOP_LABEL} (= stock, not drawn)"
    share = p.calibrated_share
    if np.isfinite(share) and share < 1:
        return f"{_name(p)} (calibrated share {format_share(share)})"
    return _name(p)


def _noop_handle(ax, color, label):
    """A legend-only entry for a profile that is not drawn."""
    ax.plot([], [], color=color, linestyle="none", marker="x", label=label, gid=LEGEND_ONLY)


def _band(ax, x, st, color, label):
    ax.plot(x, st["mean"], color=color, marker="o", ms=3, lw=1.4, label=label)
    ax.fill_between(x, st["lo"], st["hi"], color=color, alpha=0.2, lw=0)


def _count_bars(ax, x, counts):
    ax2 = ax.twinx()
    ax2.bar(x, counts, color="0.88", width=0.6, zorder=0)
    ax2.set_ylim(0, max(1, counts.max()) * 3.0)
    ax2.tick_params(labelsize=6, colors="0.5")
    ax2.set_ylabel("documents", fontsize=7, color="0.5")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)


def _title(p: AttentionProfile) -> str:
    return f"{p.group} · " if p.group else ""


def plot_view(
    profiles: Sequence[AttentionProfile], view: str, *, max_cells: int | None = None, title: str = ""
) -> Figure:
    """Mean mass per cell of ``view`` ("basket", "bin" or "segment") with 95% bands; one panel per group."""
    groups, colors = _groups(profiles), _colors(profiles)
    fig = new_figure((4.2 * len(groups) + 0.6, 3.2))
    axes = fig.subplots(1, len(groups), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        counts = None
        for p in (q for q in profiles if q.group == g):
            if p.noop:
                _noop_handle(ax, colors[p.label], _legend_label(p))
                continue
            st = p.stats(view)
            n = len(st["mean"]) if max_cells is None else min(max_cells, len(st["mean"]))
            x = np.arange(1, n + 1)
            _band(ax, x, {k: v[:n] for k, v in st.items()}, colors[p.label], _legend_label(p))
            counts = st["count"][:n] if counts is None or len(counts) < n else counts
        if counts is not None and len(counts) and view == "basket":
            _count_bars(ax, np.arange(1, len(counts) + 1), counts)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(_XLABEL.get(view, view), fontsize=8)
        ax.set_ylabel("attention mass", fontsize=8)
        ax.set_title(g or "all documents", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, lw=0.5)
        ax.set_ylim(bottom=0)
    _legend_and_title(fig, axes[0][0], title, profiles)
    return fig


def profiles_subtitle(profiles: Sequence[AttentionProfile]) -> str:
    """What an attention figure is of: the model, its token limit, the pooling query and the layers averaged
    (the line under the title), and each calibration in words (the note under the legend)."""
    model = next((p.model for p in profiles if p.model), "")
    limit = next((p.token_limit for p in profiles if p.token_limit), 0)
    words = {_name(p): Calibration.from_dict(p.calibration).describe() for p in profiles if p.calibration}
    text = "; ".join(f"{label}: {w}" for label, w in words.items()) or "stock only"
    p0 = profiles[0] if profiles else None
    what = f"{p0.query_label}, layers {', '.join(str(x) for x in p0.layers)} (of 0-{p0.num_layers - 1})" if p0 else ""
    head = " · ".join(x for x in (model, f"token limit {limit}" if limit else "", what) if x)
    return f"{head}\n{text}"


def _legend_and_title(fig, ax, title: str, profiles: Sequence[AttentionProfile] = ()) -> None:
    handles, labels = ax.get_legend_handles_labels()
    finish(fig, title=title, subtitle=profiles_subtitle(profiles) if profiles else "", handles=handles, labels=labels)


def plot_baskets(profiles: Sequence[AttentionProfile], *, max_baskets: int | None = None, title: str = "") -> Figure:
    """Figure-4 style: BOS/EOS panel + content baskets, stock vs calibrated overlaid, 95% bands."""
    groups, colors = _groups(profiles), _colors(profiles)
    fig = new_figure((5.4 * len(groups) + 0.6, 3.3))
    axes = fig.subplots(1, 2 * len(groups), squeeze=False, gridspec_kw={"width_ratios": [1, 4] * len(groups)})
    members = [[p for p in profiles if p.group == g] for g in groups]
    drawn = [[p for p in m if not p.noop] for m in members]
    width = 0.8 / max(1, max(len(m) for m in drawn))
    for gi, (g, group_profiles) in enumerate(zip(groups, members, strict=True)):
        ax_sp, ax = axes[0][2 * gi], axes[0][2 * gi + 1]
        for k, p in enumerate(drawn[gi]):
            sp = p.stats("special")
            xs = np.arange(2) + (k - (len(drawn[gi]) - 1) / 2) * width
            ok = sp["count"] > 0
            ax_sp.bar(xs[ok], sp["mean"][ok], width=width * 0.9, color=colors[p.label], alpha=0.75)
            err = np.vstack([sp["mean"] - sp["lo"], sp["hi"] - sp["mean"]])[:, ok]
            ax_sp.errorbar(xs[ok], sp["mean"][ok], yerr=err, fmt="none", ecolor="k", lw=0.8, capsize=2)
        ax_sp.set_xticks([0, 1], ["BOS", "EOS"])
        ax_sp.set_ylabel("attention mass", fontsize=8)
        ax_sp.tick_params(labelsize=7)
        ax_sp.grid(alpha=0.3, lw=0.5, axis="y")
        counts = np.zeros(0, dtype=np.int64)
        for p in group_profiles:
            if p.noop:
                _noop_handle(ax, colors[p.label], _legend_label(p))
                continue
            st = p.stats("basket")
            n = len(st["mean"]) if max_baskets is None else min(max_baskets, len(st["mean"]))
            _band(ax, np.arange(1, n + 1), {k: v[:n] for k, v in st.items()}, colors[p.label], _legend_label(p))
            counts = st["count"][:n] if len(st["count"][:n]) > len(counts) else counts
        if len(counts):
            _count_bars(ax, np.arange(1, len(counts) + 1), counts)
            ax.set_xticks(np.arange(1, len(counts) + 1))
        B = group_profiles[0].basket_size
        ax.set_xlabel(f"content basket ({B} keys each, after BOS)", fontsize=8)
        ax.set_title(f"{g or 'all documents'} — {group_profiles[0].query_label}", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, lw=0.5)
        ax.set_ylim(bottom=0)
    _legend_and_title(fig, axes[0][1], title, profiles)
    return fig


def plot_layer_heatmap(
    profiles: Sequence[AttentionProfile], *, view: str = "basket", max_cells: int | None = None, title: str = ""
) -> Figure:
    """Layer x cell mean mass (content keys only), one panel per profile; the layer set is marked."""
    fig = new_figure((3.8 * len(profiles) + 0.8, 0.35 * profiles[0].num_layers + 1.8))
    axes = fig.subplots(1, len(profiles), squeeze=False)
    maps = [p.heatmap(view)[:, :max_cells] for p in profiles]
    vmax = max(float(np.nanmax(m)) if m.size and np.isfinite(m).any() else 0.0 for m in maps) or 1.0
    im = None
    for ax, p, m in zip(axes[0], profiles, maps, strict=True):
        im = ax.imshow(
            m,
            aspect="auto",
            cmap="viridis",
            vmin=0,
            vmax=vmax,
            origin="lower",
            extent=(0.5, m.shape[1] + 0.5, -0.5, p.num_layers - 0.5),
        )
        ax.set_xticks(range(1, m.shape[1] + 1))
        ax.set_yticks(range(p.num_layers))
        ax.set_yticklabels([f"{layer}{' *' if layer in p.layers else ''}" for layer in range(p.num_layers)], fontsize=7)
        ax.set_xlabel(_XLABEL.get(view, view), fontsize=8)
        ax.set_title(f"{_title(p)}{_name(p)}" + (f"\n({NOOP_LABEL} = stock)" if p.noop else ""), fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("layer (* = averaged layer set)", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), shrink=0.9, label="mean attention mass")
    finish(fig, title=title, subtitle=profiles_subtitle(profiles))
    return fig


def save_attention_figures(
    profiles: Sequence[AttentionProfile], out_dir: str | os.PathLike, *, max_baskets: int | None = None
) -> dict[str, bytes]:
    """Write every figure as PNG + PDF under ``out_dir``; return {name: PNG bytes}."""
    if not profiles:
        raise ValueError("no attention profiles to plot")
    out = Path(out_dir)
    figs = {
        "attention_baskets": plot_baskets(
            profiles, max_baskets=max_baskets, title="Pooling attention per content basket"
        ),
        "attention_bins": plot_view(profiles, "bin", title="Pooling attention by relative position"),
        "attention_layers": plot_layer_heatmap(
            profiles, max_cells=max_baskets, title="Mean mass per layer and content basket"
        ),
    }
    if any(p.views["segment"].width for p in profiles):
        figs["attention_segments"] = plot_view(profiles, "segment", title="Pooling attention per segment position")
    return {name: save_figure(fig, out / name) for name, fig in figs.items()}


_SUMMARY = """\
<table><thead><tr>{% for c in header %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</tbody></table>"""


def _summary_cell(column: str, summary: dict[str, float]) -> str:
    """One precision per kind of column, as the terminal's table: counts whole, the share with 3 decimals, attention
    masses and ratios with 4."""
    if column == "calibrated_share":
        return format_share(summary.get(column))
    value = summary.get(column)
    if value is None or not np.isfinite(value):
        return "–"
    return f"{value:.0f}" if column in ("documents", "baskets") else f"{value:.4f}"


def summary_html(profiles: Sequence[AttentionProfile]) -> str:
    """A table of the headline numbers of each profile (escaped)."""
    rows = [(p.group, p.label + (f" — {NOOP_LABEL}" if p.noop else ""), p.summary()) for p in profiles]
    cols: list[str] = []
    for _, _, s in rows:
        cols += [c for c in s if c not in cols]
    body = [[g, lab, *(_summary_cell(c, s) for c in cols)] for g, lab, s in rows]
    header = ["group", "profile", *(SHARE_NAME if c == "calibrated_share" else c for c in cols)]
    return render_string(_SUMMARY, header=header, rows=body)


CAPTIONS = {
    "attention_baskets": "Mean attention mass of the pooling query per content basket (95% bands; grey bars: documents reaching the basket); BOS and EOS keys on the left.",
    "attention_bins": "Mean attention mass per relative-position bin of the content keys (95% bands).",
    "attention_layers": "Mean attention mass per layer and content basket (* = layers averaged in the profile).",
    "attention_segments": "Mean attention mass per segment position (95% bands); compare with the σ profile of the audit.",
}


_INTRO = """\
<p>Attention of the pooling query ({{ p.query_label }}) averaged over heads and layers {{ p.layers | list }} of \
{{ p.num_layers }}; content keys (between BOS and EOS) in baskets of {{ p.basket_size }} and in {{ p.n_bins }} \
relative-position bins.</p>
{{ params | safe }}{{ summary | safe }}"""


def attention_section(
    profiles: Sequence[AttentionProfile], out_dir: str | os.PathLike, *, max_baskets: int | None = None
) -> Section:
    """Write the figures to ``out_dir`` and return the report :class:`~posfair.report.html.Section`."""
    pngs = save_attention_figures(profiles, out_dir, max_baskets=max_baskets)
    p0 = profiles[0]
    params = key_value_html({"model": p0.model or "-", "fingerprint": p0.fingerprint, "documents": p0.n_docs})
    html = render_string(_INTRO, p=p0, params=params, summary=summary_html(profiles))
    figures = [FigureRef(png=png, caption=CAPTIONS[name], alt=name) for name, png in pngs.items()]
    return Section(title="Attention profile", html=html, figures=figures, anchor="attention-profile")


def write_attention_report(
    profiles: Sequence[AttentionProfile],
    out_dir: str | os.PathLike,
    *,
    title: str | None = None,
    max_baskets: int | None = None,
) -> Path:
    """The figures and ``<out_dir>/attention.html``, a page with the :func:`attention_section`; returns the page's path."""
    out = Path(out_dir)
    section = attention_section(profiles, out, max_baskets=max_baskets)
    return write_report(
        out / "attention.html", title or f"Attention profile — {profiles[0].model or 'model'}", [section]
    )
