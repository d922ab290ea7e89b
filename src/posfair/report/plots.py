"""Generic figures: profile grids in the style of the paper's Figures 2-3 / 5 / 7, trade-off scatters, saving.

A grid has one subplot per (row, column) cell; every :class:`ProfileSeries`
draws its per-x mean with a 95% interval (computed over cluster means, so
observations of one cluster count once), and optional grey bars on a twin axis
(e.g. the mean token length per position).

Figures are :class:`matplotlib.figure.Figure` objects made by :func:`new_figure`,
never through ``pyplot``: pyplot keeps global state (its figure registry and the
backend), and setting a backend from library code would switch a notebook user's.
A ``Figure`` renders with Agg when saved and is freed like any object.  matplotlib
is imported when a figure is made, not with this module: the audit imports this
module, and most audits are run for their numbers.
"""

from __future__ import annotations

import io
import math
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from posfair.files.atomic import atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ProfileSeries",
    "cluster_mean_ci",
    "profile_grid",
    "tradeoff_scatter",
    "heatmaps",
    "save_figure",
    "new_figure",
    "finish",
    "layout_problems",
    "LEGEND_ONLY",
    "place_label",
    "figure_heading",
    "display_labels",
    "relabel",
]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A matplotlib :class:`~matplotlib.figure.Figure` outside pyplot (see the module docstring)."""
    from matplotlib.figure import Figure  # heavy: imported when a figure is made

    return Figure(figsize=figsize)


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` wrapped to lines that fit ``width_in`` inches at ``fontsize`` (measured conservatively: 0.62 em a glyph).

    Lines break at spaces, never at a hyphen inside a word: a model's hub id (``intfloat/multilingual-e5-small``)
    stays whole.  A word longer than a line (a long local path) breaks after a ``/``, the line ending in it,
    so the path reads on as written (``"/\\n"`` joins it back).
    """
    chars = max(20, int(width_in * 72 / (fontsize * 0.62)))
    out: list[str] = []
    for line in text.split("\n"):
        for piece in textwrap.wrap(line, chars, break_on_hyphens=False, break_long_words=False) or [""]:
            out += _break_after_slashes(piece, chars)
    return "\n".join(out)


def _one_line(subtitle: str, width_in: float, fontsize: float) -> tuple[str, str]:
    """``subtitle`` as one line under the title and the rest: its `` · ``-separated parts that fit ``width_in``
    (at least the first), and the others joined, for the note under the legend."""
    parts = subtitle.split(" · ")
    keep = 1
    while keep < len(parts) and "\n" not in _wrap(" · ".join(parts[: keep + 1]), width_in, fontsize):
        keep += 1
    return " · ".join(parts[:keep]), " · ".join(parts[keep:])


def _break_after_slashes(line: str, chars: int) -> list[str]:
    """``line`` cut after ``/`` characters into lines of at most ``chars`` where it is longer (a line without a
    ``/`` in reach stays as it is)."""
    out = []
    while len(line) > chars:
        cut = line.rfind("/", 0, chars)
        if cut <= 0:
            break
        out.append(line[: cut + 1])
        line = line[cut + 1 :]
    return [*out, line]


#: point sizes of a figure's texts: the title above the panels' titles, the subtitle and the note below them
TITLE_SIZE, PANEL_TITLE_SIZE, SUBTITLE_SIZE, NOTE_SIZE = 10.5, 9.0, 8.0, 7.5
#: the narrowest figure (inches): a heading wraps to the width, so a one-panel figure gets room for one
MIN_WIDTH = 6.0
_PAD = 0.06  # inches between the canvas edge, the heading / note and the panels


def finish(
    fig: Figure, *, title: str = "", subtitle: str = "", note: str = "", handles=None, labels=None, fontsize: float = 8
) -> None:
    """The one layout of every figure: a bold title over a one-line subtitle (what the figure is of: the model, the
    token limit), the panels (constrained layout) with the legend below them in as many columns as fit the
    width, and a note in small type under the legend (the calibrations in words, the choice, the constraint).

    The subtitle's first line stays under the title; its further lines join ``note``: a long description reads
    under the figure, as a caption does, instead of pushing the panels down.  The figure is at least
    :data:`MIN_WIDTH` wide and grows by the room these texts take, so every text lies inside the canvas and the
    panels keep their size (:func:`layout_problems` checks).  The title is the figure's ``suptitle``;
    :func:`figure_heading` returns every text of the heading and the note."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_layout_engine("constrained")
    if fig.get_figwidth() < MIN_WIDTH:
        fig.set_figwidth(MIN_WIDTH)
    width = fig.get_figwidth()
    lines = subtitle.split("\n")  # an empty first line: no subtitle, only a note
    subtitle, rest = _one_line(lines[0].strip(), width - 0.2, SUBTITLE_SIZE)  # what does not fit joins the note
    note = "\n".join([x for x in [rest, *lines[1:]] if x.strip()] + ([note] if note else []))
    renderer = FigureCanvasAgg(fig).get_renderer()
    legend, legend_h = None, 0.0
    if handles:  # as many columns as fit the width, measured
        for ncol in range(len(handles), 0, -1):
            if legend is not None:
                legend.remove()
            legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=fontsize, frameon=False)
            legend.set_in_layout(False)
            box = legend.get_window_extent(renderer)
            if box.width / fig.dpi <= width - 0.2:
                break
        legend_h = box.height / fig.dpi
    panel_size = max([PANEL_TITLE_SIZE] + [ax.title.get_fontsize() for ax in fig.axes if ax.get_title()])
    title_size = max(TITLE_SIZE, panel_size + 1.5)  # the figure's title never smaller than a panel's
    if not title and subtitle:  # no title: the subtitle heads the figure, in the title's size
        title, subtitle = subtitle, ""
    texts = []  # (text, size, weight, colour) from the top
    if title:
        texts.append((_wrap(title, width - 0.2, title_size), title_size, "bold", "0.1"))
    if subtitle:
        texts.append((_wrap(subtitle, width - 0.2, SUBTITLE_SIZE), SUBTITLE_SIZE, "normal", "0.25"))
    top = _PAD + sum((t.count("\n") + 1) * size * 1.3 / 72 for t, size, _, _ in texts)
    note = _wrap(note, width - 0.3, NOTE_SIZE) if note else ""
    note_h = _PAD + (note.count("\n") + 1) * NOTE_SIZE * 1.3 / 72 if note else 0.0
    bottom = note_h + legend_h + _PAD
    height = fig.get_figheight() + top + bottom
    fig.set_figheight(height)
    y = 1 - _PAD / height
    for k, (text, size, weight, colour) in enumerate(texts):
        kw = dict(fontsize=size, fontweight=weight, color=colour, va="top", ha="center", in_layout=False)
        if k == 0:
            fig.suptitle(text, x=0.5, y=y, **kw)
        else:
            fig.text(0.5, y, text, **kw)
        y -= (text.count("\n") + 1) * size * 1.3 / 72 / height
    if legend is not None:  # under the panels, over the note
        legend.set_bbox_to_anchor((0.5, (note_h + _PAD / 2) / height), transform=fig.transFigure)
    if note:
        fig.text(0.15 / width, _PAD / height, note, fontsize=NOTE_SIZE, color="0.3", va="bottom", ha="left",
                 in_layout=False)  # fmt: skip
    # the panels in the band between the heading and the legend: (left, bottom, width, height)
    fig.get_layout_engine().set(rect=(0, bottom / height, 1, 1 - (top + _PAD / 2 + bottom) / height))


def figure_heading(fig: Figure) -> str:
    """Every figure-level text (the title, the subtitle, the note under the legend) as one line of words, a path
    broken after a ``/`` joined back: what a test reads to know what the figure says it is of."""
    texts = [fig._suptitle] if fig._suptitle is not None else []
    texts += [t for t in fig.texts if t is not fig._suptitle]  # (a suptitle is one of fig.texts too)
    return " ".join(" ".join(t.get_text().replace("/\n", "/") for t in texts).split())


def display_labels(names: Mapping[str, str]) -> dict[str, str]:
    """A figure's name for each label: ``names`` maps each label to the short name its calibration gives it
    (:meth:`posfair.Calibration.figure_label`: the variant as the command line spells it, without the prior's
    digest); a label whose short name would name two settings of the figure stays whole."""
    counts: dict[str, int] = {}
    for v in names.values():
        counts[v] = counts.get(v, 0) + 1
    return {lab: (v if counts[v] == 1 else lab) for lab, v in names.items()}


def relabel(text: str, names: dict[str, str]) -> str:
    """``text`` with every label of ``names`` replaced by its figure name (longest labels first)."""
    for lab in sorted(names, key=len, reverse=True):
        if names[lab] != lab:
            text = text.replace(lab, names[lab])
    return text


#: the ring around a highlighted point (scatter size, points^2) and how far its label starts from the point (points):
#: past the ring's radius and line, so the label never sits on the ring
RING_SIZE = 160
RING_CLEARANCE = 9
#: the gid of a ringed point's label (:func:`spread_labels` keeps it off the ring)
RINGED = "ringed"


def spread_labels(fig: Figure, tries: int = 12) -> None:
    """Move point annotations off each other and off the canvas edge (in steps around the point); a label that
    finds no free place is hidden (its point is still drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed = []
    offsets = [
        (4, 4),
        (4, -12),
        (-4, 4),
        (-4, -12),
        (10, 12),
        (10, -20),
        (-10, 12),
        (-10, -20),
        (18, 0),
        (-18, 0),
        (4, 20),
        (4, -28),
    ][:tries]
    for ax in fig.axes:
        for t in [t for t in ax.texts if isinstance(t, Annotation)]:
            ok = False
            extra = RING_CLEARANCE - 4 if t.get_gid() == RINGED else 0  # a ringed point's label stays off its ring
            for dx, dy in offsets:
                dx, dy = dx + math.copysign(extra, dx), dy + (math.copysign(extra, dy) if dy else 0)
                t.set_position((dx, dy))
                t.set_horizontalalignment("left" if dx >= 0 else "right")
                bb = t.get_window_extent(renderer)
                inside = ax.bbox.x0 <= bb.x0 and bb.x1 <= ax.bbox.x1 and ax.bbox.y0 <= bb.y0 and bb.y1 <= ax.bbox.y1
                if inside and not any(bb.overlaps(o) for o in placed):
                    ok = True
                    break
            if ok:
                placed.append(bb)
            else:
                t.set_visible(False)


#: the gid of a legend-only artist (a profile that is named but not drawn): no "empty legend entry"
LEGEND_ONLY = "legend-only"
#: the most a figure's heading (title and subtitle) may take: lines, and share of the figure's height
MAX_HEADING_LINES, MAX_HEADING_SHARE = 3, 0.2


def layout_problems(fig: Figure) -> list[str]:
    """What would make the figure hard to read, drawn at its real size (one line each):

    * ``outside the canvas``: a text cut by the image's edge;
    * ``overlap``: two texts on each other (titles, axis labels, legend entries, annotations, the heading and
      the note; a tick label against any of these; tick labels among themselves are matplotlib's business);
    * ``heading``: a title and subtitle of more than :data:`MAX_HEADING_LINES` lines or more than
      :data:`MAX_HEADING_SHARE` of the height;
    * ``clipped marker``: a scatter marker cut by its panel's edge;
    * ``covers data``: a text on an opaque box (a label such as "chosen: ...") over drawn points or line vertices;
    * ``empty legend entry``: a legend naming an artist that draws no point;
    * ``text size``: a text under :data:`MIN_TEXT_PX` pixels at the size the report shows the figure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation, Text

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    ticks, undrawn = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(t.label1) for t in axis._update_ticks()} | {id(t.label2) for t in axis._update_ticks()}
            for t in axis.get_ticklabels(which="both") + axis.get_ticklabels(which="both", minor=True):
                ticks.add(id(t))
                if id(t) not in drawn:  # a tick outside the view: matplotlib keeps its text but does not draw it
                    undrawn.add(id(t))
    texts = [
        t
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.figure is fig and id(t) not in undrawn
    ]
    problems, boxes = [], []
    for t in texts:
        bb = t.get_window_extent(renderer)
        patch = t.get_bbox_patch()
        if patch is not None:  # the box drawn around the text (e.g. a label's white frame) is part of it
            bb = bb.union([bb, patch.get_window_extent(renderer)])
        if bb.x0 < canvas.x0 - 1 or bb.y0 < canvas.y0 - 1 or bb.x1 > canvas.x1 + 1 or bb.y1 > canvas.y1 + 1:
            problems.append(f"outside the canvas: {t.get_text()!r}")
        boxes.append((t, bb))
    cells = {id(t) for ax in fig.axes for t in ax.texts if not isinstance(t, Annotation)}  # heatmap cell values
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1 :]:
            if (id(a) in cells and id(b) in cells) or (id(a) in ticks and id(b) in ticks):
                continue
            if ba.overlaps(bb) and ba.intersection(ba, bb).width > 1 and ba.intersection(ba, bb).height > 1:
                problems.append(f"overlap: {a.get_text()!r} / {b.get_text()!r}")
    problems += _heading_problems(fig, renderer) + _data_problems(fig, renderer, boxes) + _size_problems(fig, texts)
    return problems


#: the report's content width in pixels (its page is at most 1200 px wide, less its padding) and the PNG's dpi
REPORT_WIDTH_PX, SAVE_DPI = 1168, 130
#: the smallest text, in pixels as the report shows the figure (shrunk to its width), a reader reads without zoom
MIN_TEXT_PX = 9.0


def shown_scale(fig: Figure) -> float:
    """How much the report shrinks the figure's PNG (saved at :data:`SAVE_DPI`) to fit its width (1: not at all)."""
    return min(1.0, REPORT_WIDTH_PX / (fig.get_figwidth() * SAVE_DPI))


def _size_problems(fig: Figure, texts) -> list[str]:
    """``text size``: a text smaller than :data:`MIN_TEXT_PX` pixels at the size the report shows the figure."""
    if not texts:
        return []
    smallest = min(texts, key=lambda t: t.get_fontsize())
    px = smallest.get_fontsize() * SAVE_DPI / 72 * shown_scale(fig)
    if px < MIN_TEXT_PX:
        return [f"text size: {smallest.get_text()!r} is {px:.1f} px in the report (at least {MIN_TEXT_PX:g})"]
    return []


def _heading_problems(fig: Figure, renderer) -> list[str]:
    heading = [fig._suptitle] if fig._suptitle is not None else []
    heading += [t for t in fig.texts if t is not fig._suptitle]  # (a suptitle is one of fig.texts too)
    heading = [t for t in heading if t.get_text().strip() and t.get_visible()]
    heading = [t for t in heading if t.get_va() == "top"]  # the note under the legend is anchored at its bottom
    if not heading:
        return []
    lines = sum(t.get_text().count("\n") + 1 for t in heading)
    top = max(t.get_window_extent(renderer).y1 for t in heading)
    share = (top - min(t.get_window_extent(renderer).y0 for t in heading)) / fig.bbox.height
    if lines > MAX_HEADING_LINES or share > MAX_HEADING_SHARE:
        return [f"heading: {lines} lines, {share:.0%} of the height"]
    return []


def _data_points(ax) -> np.ndarray:
    """Display coordinates of every drawn point of ``ax``: scatter offsets and line vertices."""
    from matplotlib.collections import PathCollection

    pts = [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
           if isinstance(c, PathCollection) and c.get_visible() and len(c.get_offsets())]  # fmt: skip
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if line.get_visible() and len(xy) and not line.get_label().startswith("_"):
            pts.append(line.get_transform().transform(xy))
    pts = [p[np.isfinite(p).all(axis=1)] for p in pts]
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def _data_problems(fig: Figure, renderer, boxes) -> list[str]:
    from matplotlib.collections import PathCollection

    problems = []
    scale = fig.dpi / 72
    for ax in fig.axes:
        box = ax.bbox
        for c in ax.collections:
            if (
                not isinstance(c, PathCollection)
                or not c.get_visible()
                or not c.get_clip_on()
                or not len(c.get_offsets())
            ):
                continue
            xy = c.get_offset_transform().transform(c.get_offsets())
            sizes = np.broadcast_to(np.asarray(c.get_sizes(), dtype=float), (len(xy),))
            r = np.sqrt(sizes) / 2 * scale  # a marker of size s points² spans about sqrt(s) points
            inside = (xy[:, 0] - r >= box.x0 - 0.5) & (xy[:, 0] + r <= box.x1 + 0.5)
            inside &= (xy[:, 1] - r >= box.y0 - 0.5) & (xy[:, 1] + r <= box.y1 + 0.5)
            visible = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
            if (visible & ~inside).any():
                problems.append(f"clipped marker: {c.get_label()!r} at the edge of {ax.get_title()!r}")
        pts = _data_points(ax)
        for t, _ in boxes:
            patch = t.get_bbox_patch()
            if patch is None or t.axes is not ax or patch.get_facecolor()[3] < 0.5:
                continue
            bb = _text_box(t, renderer)
            hidden = int(((pts[:, 0] > bb.x0) & (pts[:, 0] < bb.x1) & (pts[:, 1] > bb.y0) & (pts[:, 1] < bb.y1)).sum())
            if hidden:
                problems.append(f"covers data: {t.get_text()!r} over {hidden} point(s)")
    drawn = {}
    for ax in fig.axes:
        for a in [*(c for c in ax.collections if isinstance(c, PathCollection)), *ax.get_lines()]:
            n = len(a.get_offsets()) if isinstance(a, PathCollection) else len(np.atleast_1d(a.get_xdata(orig=False)))
            if not a.get_label().startswith("_"):
                drawn[a.get_label()] = drawn.get(a.get_label(), 0) + (1 if a.get_gid() == LEGEND_ONLY else n)
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
        for text in legend.get_texts():
            if drawn.get(text.get_text(), 1) == 0:
                problems.append(f"empty legend entry: {text.get_text()!r}")
    return problems


@dataclass
class ProfileSeries:
    """``data`` has columns ``row, col, x, value`` and optionally ``cluster``.

    ``draw=False``: the series is named in the legend but not drawn (e.g. a calibration that
    calibrated nothing, whose line would lie exactly on the stock line and hide it).
    """

    label: str
    data: pd.DataFrame
    color: str | None = None
    linestyle: str = "-"
    marker: str = "o"
    draw: bool = True


def cluster_mean_ci(data: pd.DataFrame, z: float = 1.96) -> pd.DataFrame:
    """Per (row, col, x): mean and a normal 95% interval over cluster means."""
    d = data.dropna(subset=["value"])
    if "cluster" in d.columns:
        d = d.groupby(["row", "col", "x", "cluster"], sort=False)["value"].mean().reset_index()
    g = d.groupby(["row", "col", "x"], sort=True)["value"]
    out = g.agg(["mean", "std", "count"]).reset_index()
    half = z * out["std"].fillna(0.0) / np.sqrt(out["count"].clip(lower=1))
    out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out


#: the most panels a grid figure puts side by side (3 of 3.2 in: the report shows such a figure at 90 % or more)
MAX_PANEL_COLUMNS = 3


def _legend_only(series: Sequence[ProfileSeries]) -> dict:
    """The legend entries of the series not drawn (``draw=False``), by label."""
    from matplotlib.lines import Line2D

    return {
        s.label: Line2D([], [], color=s.color or "0.5", linestyle="none", marker="x", gid=LEGEND_ONLY)
        for s in series
        if not s.draw
    }


def _panel_bars(ax, b: pd.DataFrame, bar_max: float, bar_label: str, right: bool) -> None:
    """The grey bars behind one panel's lines (``b``: columns ``x, bar``) on a twin axis of their own, labelled on
    the grid's right edge (``right``)."""
    ax2 = ax.twinx()
    ax2.bar(b["x"], b["bar"], color="0.85", width=0.6, zorder=0, label=bar_label)
    ax2.set_ylim(0, bar_max * 1.15 if bar_max > 0 else 1)
    if right:
        ax2.set_ylabel(bar_label, fontsize=8, color="0.4")
    ax2.tick_params(labelsize=7, colors="0.4")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)


def profile_grid(
    series: Sequence[ProfileSeries],
    *,
    rows: Sequence,
    cols: Sequence,
    bars: pd.DataFrame | None = None,
    row_label: Callable[[object], str] = str,
    col_label: Callable[[object], str] = str,
    ylabel: str = "",
    bar_label: str = "",
    xlabel: str = "position",
    title: str = "",
    subtitle: str = "",
) -> Figure:
    """Build the figure (``bars``: columns ``row, col, x, bar``); ``subtitle``: what the figure is of (the
    model, the token limit, the calibrations in words), under the title."""
    nr, nc = len(rows), len(cols)
    # at most MAX_PANEL_COLUMNS panels side by side (wider, the report shrinks the text below what reads): more
    # columns wrap, each row of the grid (n) then takes `wrap` rows of panels, each panel titled
    wrap = math.ceil(nc / MAX_PANEL_COLUMNS)
    per_row = math.ceil(nc / wrap)
    fig = new_figure((3.2 * per_row + 0.6, 2.5 * nr * wrap + 0.8))
    grid = fig.subplots(nr * wrap, per_row, squeeze=False, sharey=True)
    for extra in range(nc, wrap * per_row):  # the wrapped rows' empty places
        for i in range(nr):
            fig.delaxes(grid[i * wrap + extra // per_row][extra % per_row])

    def place(i: int, j: int):
        return grid[i * wrap + j // per_row][j % per_row]

    hidden = _legend_only(series)
    series = [s for s in series if s.draw]
    stats = [(s, cluster_mean_ci(s.data)) for s in series]
    bar_stats = (
        bars.groupby(["row", "col", "x"])["bar"].mean().reset_index() if bars is not None and len(bars) else None
    )
    bar_max = float(bar_stats["bar"].max()) if bar_stats is not None else 0.0
    handles = {}
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = place(i, j)
            if bar_stats is not None:
                b = bar_stats[(bar_stats["row"] == r) & (bar_stats["col"] == c)]
                right = (j == nc - 1 or j % per_row == per_row - 1) and bar_label
                _panel_bars(ax, b, bar_max, bar_label, right)
            for s, st in stats:
                cell = st[(st["row"] == r) & (st["col"] == c)]
                if not len(cell):
                    continue
                (line,) = ax.plot(
                    cell["x"],
                    cell["mean"],
                    color=s.color,
                    linestyle=s.linestyle,
                    marker=s.marker,
                    ms=3,
                    lw=1.4,
                    label=s.label,
                )
                ax.fill_between(cell["x"], cell["lo"], cell["hi"], color=line.get_color(), alpha=0.2, lw=0)
                handles.setdefault(s.label, line)
            xs = sorted({x for _, st in stats for x in st[(st["row"] == r) & (st["col"] == c)]["x"]})
            if xs:
                ax.set_xticks(xs)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3, lw=0.5)
            if i == 0 or wrap > 1:
                ax.set_title(col_label(c), fontsize=9)
            if j % per_row == 0:
                ax.set_ylabel(f"{row_label(r)}\n{ylabel}", fontsize=8)
            if i == nr - 1 or wrap > 1:
                ax.set_xlabel(xlabel, fontsize=8)
    handles.update(hidden)
    finish(fig, title=title, subtitle=subtitle, handles=list(handles.values()), labels=list(handles.keys()))
    return fig


def _label_points(ax, labelled) -> None:
    """Each point's label beside it (a ringed point's off the ring), tied to it by a thin line once moved."""
    for r in labelled:
        ringed = bool(getattr(r, "highlight", False))
        ax.annotate(
            str(r.label),
            (r.x, r.y),
            fontsize=7 if not r.reference else 8,
            xytext=(RING_CLEARANCE, RING_CLEARANCE) if ringed else (4, 4),  # a ringed point's label: off the ring
            gid=RINGED if ringed else None,
            textcoords="offset points",
            arrowprops=dict(
                arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=3
            ),  # ties a moved label to its point
        )


def tradeoff_scatter(
    points: pd.DataFrame,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    subtitle: str = "",
    panel_label: Callable[[object], str] = str,
    annotate: bool = True,
    threshold: tuple[float, str] | None = None,
    ybounds: tuple[float, float] | None = None,
) -> Figure:
    """One panel per ``panel``, one point per row: columns ``panel, label, x, y, reference`` (bool).

    Reference points (e.g. the stock model) are drawn as a large black star and
    labelled; the others as circles, labelled when ``annotate`` (what a trade-off
    plot such as profile spread against own-segment recall needs).  An optional
    bool column ``highlight`` rings points (e.g. a chosen setting) in red.  Panels share their y axis (a
    1-point difference looks like one), point labels are moved off each other (a label that finds no free
    place is left out, its point still drawn), and ``threshold = (y, label)`` draws a dashed line (e.g. the
    constraint's feasibility limit).  ``ybounds``: the values y can take (a recall: ``(0, 1)``), see
    :func:`keep_within`.
    """
    panels = list(dict.fromkeys(points["panel"]))
    # at most MAX_PANEL_COLUMNS panels side by side, as profile_grid: a language grid's nine configurations in one
    # row clipped their titles at the edge and ran their axis labels together; more wrap onto further rows
    per_row = min(max(1, len(panels)), MAX_PANEL_COLUMNS)
    n_rows = math.ceil(max(1, len(panels)) / per_row)
    fig = new_figure((min(4.2 * per_row + 0.4, 12.0), 3.8 * n_rows))
    grid = fig.subplots(n_rows, per_row, squeeze=False, sharey=True)
    for extra in range(max(1, len(panels)), n_rows * per_row):  # the last row's empty places
        fig.delaxes(grid[extra // per_row][extra % per_row])
    axes = [[ax for row in grid for ax in row][: max(1, len(panels))]]
    for ax, panel in zip(axes[0], panels, strict=False):  # no points: one empty panel
        d = points[points["panel"] == panel]
        ref = d["reference"].astype(bool)
        if (~ref).any():  # a stock-only panel names no "calibrated" points it does not draw
            ax.scatter(
                d.loc[~ref, "x"], d.loc[~ref, "y"], s=22, color="#1f4e9c", alpha=0.8, label="calibrated", zorder=2
            )
        if ref.any():
            ax.scatter(d.loc[ref, "x"], d.loc[ref, "y"], s=140, marker="*", color="black", label="stock", zorder=3)
        ax.margins(0.12)  # a marker at the edge of the data is drawn whole
        if "highlight" in d.columns and d["highlight"].astype(bool).any():
            hi = d["highlight"].astype(bool)
            ax.scatter(
                d.loc[hi, "x"],
                d.loc[hi, "y"],
                s=RING_SIZE,
                facecolors="none",
                edgecolors="#b2182b",
                linewidths=1.6,
                label="chosen",
                zorder=4,
            )
        if threshold is not None:
            ax.axhline(threshold[0], color="#b2182b", lw=1.0, ls="--", label=threshold[1], zorder=1)
        _label_points(ax, [r for r in d.itertuples(index=False) if r.reference or annotate])
        ax.set_title(panel_label(panel), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, lw=0.5)
    legend = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    finish(fig, title=title, subtitle=subtitle, handles=list(legend.values()), labels=list(legend))
    if ybounds is not None:
        keep_within(axes[0][0], ybounds)  # (the panels share their y axis)
    spread_labels(fig)
    return fig


def heatmaps(
    panels: Sequence[tuple[str, pd.DataFrame, pd.DataFrame]],
    *,
    xlabel: str,
    ylabel: str,
    colorbar: str = "",
    title: str = "",
    subtitle: str = "",
) -> Figure:
    """Annotated heatmaps side by side on one symmetric diverging colour scale.

    Each panel is ``(title, values, labels)``: ``values`` a numeric frame (rows drawn top to
    bottom, NaN left blank), ``labels`` a frame of the same shape with each cell's text.
    """
    panels = list(panels)
    if not panels:
        raise ValueError("no heatmap panels")
    finite = [np.abs(v.to_numpy(dtype=float))[np.isfinite(v.to_numpy(dtype=float))] for _, v, _ in panels]
    vmax = max([float(f.max()) for f in finite if f.size] or [1.0]) or 1.0
    rows, cols = panels[0][1].shape
    width = max(3.0, 0.62 * cols + 1.6)
    fig = new_figure((width * len(panels) + 0.8, max(2.6, 0.5 * rows + 1.6)))
    fig.set_layout_engine("constrained")  # room for the labels and the shared colour bar
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for ax, (name, values, labels) in zip(axes, panels, strict=True):
        v = values.to_numpy(dtype=float)
        image = ax.imshow(np.ma.masked_invalid(v), cmap="RdBu", vmin=-vmax, vmax=vmax, aspect="auto")
        ax.set_xticks(range(v.shape[1]), [str(c) for c in values.columns], fontsize=7)
        ax.set_yticks(range(v.shape[0]), [str(r) for r in values.index], fontsize=7)
        for i in range(v.shape[0]):
            for j in range(v.shape[1]):
                text = str(labels.iat[i, j])
                if text:
                    dark = np.isfinite(v[i, j]) and abs(v[i, j]) > 0.6 * vmax
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    if image is not None and colorbar:
        fig.colorbar(image, ax=list(axes), shrink=0.8, label=colorbar)
    finish(fig, title=title, subtitle=subtitle)
    return fig


def front_lines(
    points: pd.DataFrame,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    subtitle: str = "",
    threshold: tuple[float, str] | None = None,
    ybounds: tuple[float, float] | None = None,
) -> Figure:
    """Several Pareto fronts on one axes: columns ``series, label, x, y, on_front, reference, highlight`` (bools).

    Every point of a series is a faint dot in the series' colour; its front (``on_front``)
    is joined by a line in order of ``x``; reference points (the stock model) are one
    black star; ``highlight`` points (the chosen setting) are ringed in red and labelled
    in a box so the label stays legible over the lines.  ``ybounds``: the values y can take (:func:`keep_within`).
    """
    fig = new_figure((7.2, 4.8))
    ax = fig.subplots()
    colours = ["#1f4e9c", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"]
    ref = points["reference"].astype(bool)
    for i, series in enumerate(dict.fromkeys(points.loc[~ref, "series"])):
        d = points[(points["series"] == series) & ~ref]
        c = colours[i % len(colours)]
        ax.scatter(d["x"], d["y"], s=12, color=c, alpha=0.35, zorder=2)
        f = d[d["on_front"].astype(bool)].sort_values("x")
        ax.plot(f["x"], f["y"], "-o", color=c, ms=4, lw=1.4, label=f"{series} front", zorder=3)
    if ref.any():
        r = points[ref].iloc[0]
        ax.scatter([r["x"]], [r["y"]], s=160, marker="*", color="black", label="stock", zorder=4)
        ax.annotate(str(r["label"]), (r["x"], r["y"]), fontsize=8, xytext=(5, -10), textcoords="offset points")
    hi = points[points["highlight"].astype(bool) & ~ref] if "highlight" in points.columns else points.iloc[0:0]
    chosen = []
    for r in hi.itertuples(index=False):
        ax.scatter([r.x], [r.y], s=190, facecolors="none", edgecolors="#b2182b", linewidths=1.8, zorder=5)
        chosen.append(
            ax.annotate(
                f"chosen: {r.label}",
                (r.x, r.y),
                fontsize=8,
                xytext=(12, 14),
                textcoords="offset points",
                zorder=6,
                bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#b2182b", lw=0.8),
                arrowprops=dict(arrowstyle="-", color="#b2182b", lw=0.8),
            )
        )
    ax.margins(0.08)
    if threshold is not None:
        ax.axhline(threshold[0], color="#b2182b", lw=1.0, ls="--", label=threshold[1], zorder=1)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, lw=0.5)
    handles, labels = ax.get_legend_handles_labels()
    finish(fig, title=title, subtitle=subtitle, handles=handles, labels=labels)
    if ybounds is not None:
        keep_within(ax, ybounds)
    for label in chosen:
        place_label(fig, label)
    return fig


def keep_within(ax, bounds: tuple[float, float]) -> None:
    """The y axis of a quantity that lives in ``bounds`` (a recall in [0, 1]): matplotlib's margin beyond a bound
    is cut to the room the largest marker needs to be drawn whole (and a point's label, where the axes label
    points), and no tick beyond a bound is labelled (there is no recall of 1.02).  Call it once the figure's layout is set (after :func:`finish`): the room is measured
    in points on the drawn axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PathCollection
    from matplotlib.text import Annotation

    lo, hi = bounds
    a, b = ax.get_ylim()
    if a < lo or b > hi:
        fig = ax.figure
        FigureCanvasAgg(fig)
        fig.canvas.draw()  # the axes' height after the layout
        sizes = [float(np.max(c.get_sizes())) for c in ax.collections
                 if isinstance(c, PathCollection) and len(c.get_offsets()) and len(c.get_sizes())]  # fmt: skip
        room = np.sqrt(max(sizes, default=0.0)) / 2 + 1.5  # the largest marker's radius and a little, in points
        labels = [t.get_fontsize() for t in ax.texts if isinstance(t, Annotation)]
        room = max(room, max(labels, default=0.0) + 8)  # a point's label above it, as below it, inside the axes
        f = min(room / (ax.bbox.height * 72 / fig.dpi), 0.25)  # as a share of the axis
        # new limits A, B: B = hi + f (B - A) where the top is cut, A = lo - f (B - A) where the bottom is
        if a < lo and b > hi:
            span = (hi - lo) / (1 - 2 * f)
            a, b = lo - f * span, hi + f * span
        elif b > hi:
            b = (hi - f * a) / (1 - f)
        else:
            a = (lo - f * b) / (1 - f)
        ax.set_ylim(a, b)
    eps = 1e-9 * max(1.0, abs(hi - lo))
    ax.set_yticks([min(max(t, lo), hi) for t in ax.get_yticks() if lo - eps <= t <= hi + eps])  # 1.0000000002 is 1
    ax.set_ylim(a, b)  # (set_yticks may widen the view to its ticks)


def _text_box(t, renderer):
    """The window extent of a text and the box drawn around it, without an annotation's arrow."""
    from matplotlib.text import Text

    bb = Text.get_window_extent(t, renderer)
    patch = t.get_bbox_patch()
    if patch is not None:
        t.update_bbox_position_size(renderer)
        bb = bb.union([bb, patch.get_window_extent(renderer)])
    return bb


def place_label(fig: Figure, label) -> None:
    """Move an annotation (its text offset from its point) to the place around the point, inside its panel, that
    hides the fewest drawn points and texts (a box over a front would hide the front)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = label.axes
    pts = _data_points(ax)
    others = [t.get_window_extent(renderer) for t in ax.texts if t is not label and t.get_visible()]
    best = None
    for k, (dx, dy) in enumerate([(12, 14), (12, -22), (-12, 14), (-12, -22), (24, 30), (24, -38), (-24, 30),
                                  (-24, -38), (40, 0), (-40, 0), (12, 48), (12, -56), (-12, 48), (-12, -56)]):  # fmt: skip
        label.set_position((dx, dy))
        label.set_horizontalalignment("left" if dx >= 0 else "right")
        bb = _text_box(label, renderer)  # the text and its box, not the thin line to the point
        outside = not (ax.bbox.x0 <= bb.x0 and bb.x1 <= ax.bbox.x1 and ax.bbox.y0 <= bb.y0 and bb.y1 <= ax.bbox.y1)
        hidden = int(((pts[:, 0] > bb.x0) & (pts[:, 0] < bb.x1) & (pts[:, 1] > bb.y0) & (pts[:, 1] < bb.y1)).sum())
        cost = (outside, hidden + sum(bb.overlaps(o) for o in others), k)
        if best is None or cost < best[0]:
            best = (cost, (dx, dy))
    label.set_position(best[1])
    label.set_horizontalalignment("left" if best[1][0] >= 0 else "right")


def save_figure(fig: Figure, path_stem: str | os.PathLike, dpi: int = SAVE_DPI) -> bytes:
    """Write ``<stem>.png`` and ``<stem>.pdf`` atomically; return the PNG bytes (for embedding).

    The figure is not closed: a :class:`~matplotlib.figure.Figure` made by :func:`new_figure` is
    freed with its last reference (a figure made through pyplot is its creator's to close).
    """
    stem = Path(path_stem)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    png = buf.getvalue()
    atomic_write(stem.with_suffix(".png"), lambda p: p.write_bytes(png))
    atomic_write(stem.with_suffix(".pdf"), lambda p: fig.savefig(p, format="pdf"))
    return png
