import base64
import re

import numpy as np
import pandas as pd
import pytest

from posfair.report.html import FigureRef, Section, key_value_html, render_report, render_string, write_report
from posfair.report.plots import ProfileSeries, cluster_mean_ci, profile_grid, save_figure
from posfair.report.tables import Table, to_csv, to_html, to_latex, to_markdown, write_table


def _table():
    idx = pd.MultiIndex.from_tuples([(3, "β0"), (3, "β2"), (4, "β0")], names=["n", "coef"])
    return Table(
        "T",
        pd.DataFrame(
            [["0.75", "0.81"], ["-0.05 ◊", "-0.13 •"], ["0.71", "a|b_c"]], index=idx, columns=["en", "[de, en]"]
        ),
        "cap",
        "t1",
    )


def _cells(line: str) -> list[str]:
    """The cells of a Markdown pipe-table row (escaped pipes kept), whatever the padding."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_markdown_blanks_repeated_group_labels():
    md = to_markdown(_table()).splitlines()
    assert md[0] == "**T**"
    assert _cells(md[2]) == ["n", "coef", "en", "[de, en]"]
    assert re.fullmatch(r"\|:-+\|:-+\|-+:\|-+:\|", md[3])  # index columns left, cells right
    assert _cells(md[4]) == ["3", "β0", "0.75", "0.81"]
    assert _cells(md[5]) == ["", "β2", "-0.05 ◊", "-0.13 •"]
    assert _cells(md[6]) == ["4", "β0", "0.71", "a\\|b_c"]
    assert md[-1] == "cap"


def test_markdown_keeps_formatted_numbers():
    """Cells are strings already formatted: the Markdown writer must not re-parse them as numbers."""
    t = Table("", pd.DataFrame({"a": ["0.000", "1e3", "-0.020", "007"]}))
    assert [_cells(line)[0] for line in to_markdown(t).splitlines()[2:]] == ["0.000", "1e3", "-0.020", "007"]


def test_csv_keeps_every_label():
    assert to_csv(_table()).splitlines()[0] == 'n,coef,en,"[de, en]"'
    df = pd.read_csv(pd.io.common.StringIO(to_csv(_table())))
    assert df["n"].tolist() == [3, 3, 4]
    assert df["en"].tolist() == ["0.75", "-0.05 ◊", "0.71"]


def test_latex_escapes_marks_and_specials():
    tex = to_latex(_table())
    assert r"-0.05 $^{\diamond}$" in tex and r"-0.13 $^{\bullet}$" in tex
    assert r"a|b\_c" in tex and r"$\beta$0" in tex
    assert tex.count(r"\midrule") == 2  # header rule + one group separator
    assert r"\label{tab:t1}" in tex


def test_latex_layout():
    lines = to_latex(_table()).splitlines()
    assert lines[0] == r"\begin{table}[t]" and lines[-1] == r"\end{table}"
    assert r"\begin{tabular}{llrr}" in lines and r"\toprule" in lines and r"\bottomrule" in lines
    assert r"\caption{T cap}" in lines
    body = lines[lines.index(r"\toprule") + 1 : lines.index(r"\bottomrule")]
    assert body == [
        r"n & coef & en & [de, en] \\",
        r"\midrule",
        r"3 & $\beta$0 & 0.75 & 0.81 \\",
        r" & $\beta$2 & -0.05 $^{\diamond}$ & -0.13 $^{\bullet}$ \\",
        r"\midrule",  # a new group of the first index level
        r"4 & $\beta$0 & 0.71 & a|b\_c \\",
    ]


def test_write_table_is_atomic_and_complete(tmp_path):
    paths = write_table(_table(), tmp_path)
    assert {p.suffix for p in paths.values()} == {".md", ".csv", ".tex"}
    assert not list(tmp_path.glob("*.tmp"))
    assert paths["md"].read_text() == to_markdown(_table())


def test_html_table_escapes():
    t = Table("<x>", pd.DataFrame({"a": ["<b>"]}))
    h = to_html(t)
    assert "<td>&lt;b&gt;</td>" in h and '<p class="table-title">&lt;x&gt;</p>' in h
    assert "<b>" not in h


def test_cluster_mean_ci_against_direct():
    rng = np.random.default_rng(0)
    d = pd.DataFrame(
        {
            "row": 3,
            "col": "en",
            "x": np.tile([1, 2], 40),
            "cluster": np.repeat(np.arange(10), 8),
            "value": rng.normal(size=80),
        }
    )
    st = cluster_mean_ci(d)
    for x in (1, 2):
        cm = d[d.x == x].groupby("cluster")["value"].mean()
        r = st[st.x == x].iloc[0]
        assert r["mean"] == pytest.approx(cm.mean())
        half = 1.96 * cm.std(ddof=1) / np.sqrt(len(cm))
        assert r["hi"] - r["mean"] == pytest.approx(half)
        assert r["mean"] - r["lo"] == pytest.approx(half)


def test_profile_grid_and_report(tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for n in (2, 3):
        for cfg in ("en", "de"):
            for p in range(1, n + 1):
                for c in range(5):
                    rows.append(
                        {"row": n, "col": cfg, "x": p, "cluster": c, "value": 0.8 - 0.1 * p + rng.normal(0, 0.01)}
                    )
    data = pd.DataFrame(rows)
    bars = data.rename(columns={"value": "bar"}).assign(bar=lambda d: 100 + d["x"])
    fig = profile_grid([ProfileSeries("stock", data), ProfileSeries("cal", data.assign(value=data.value + 0.05), linestyle="--")],
                       rows=[2, 3], cols=["en", "de"], bars=bars, row_label=lambda n: f"n = {n}", ylabel="cos", bar_label="tokens")  # fmt: skip
    # the lines drawn are the data's per-position means (over cluster means), each in the panel of its (n, config)
    panels = [ax for ax in fig.axes if ax.get_lines()]  # the grid's panels, row by row (the bar axes draw no line)
    for ax, (n, cfg) in zip(panels, [(2, "en"), (2, "de"), (3, "en"), (3, "de")], strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        cell = data[(data.row == n) & (data.col == cfg)]
        expected = cell.groupby(["x", "cluster"])["value"].mean().groupby("x").mean()
        np.testing.assert_allclose(lines["stock"].get_xydata(), np.c_[expected.index, expected.to_numpy()])
        np.testing.assert_allclose(lines["cal"].get_ydata(), expected.to_numpy() + 0.05)
    # the grey bars are the bars' per-position means (100 + x here), one bar per position, in the same panels
    bar_axes = [ax for ax in fig.axes if ax.patches and not ax.get_lines()]
    for ax, n in zip(bar_axes, [2, 2, 3, 3], strict=True):
        drawn = [(p.get_x() + p.get_width() / 2, p.get_height()) for p in ax.patches]
        np.testing.assert_allclose(drawn, [(x, 100 + x) for x in range(1, n + 1)])
    png = save_figure(fig, tmp_path / "fig")
    assert (tmp_path / "fig.png").read_bytes() == png
    assert (tmp_path / "fig.pdf").read_bytes()[:4] == b"%PDF"
    sections = [
        Section("Summary", "<p>hello</p>", figures=[FigureRef(png, "a figure")]),
        Section("Extra", "<p>from another module</p>", subsections=[Section("Sub", "<p>nested</p>")]),
    ]
    html = render_report("Title <&>", sections, subtitle="sub", generated="now")
    assert "Title &lt;&amp;&gt;" in html
    assert "data:image/png;base64," + base64.b64encode(png).decode() in html
    assert html.index("Summary") < html.index("Extra") < html.index("nested")
    assert "<h3>Sub</h3>" in html
    path = write_report(tmp_path / "r.html", "T", sections)
    assert path.read_text().startswith("<!DOCTYPE html>")


def test_fragments_escape_once_and_nest():
    kv = key_value_html({"a<b": "it's & <i>", "n": 3})
    assert (
        kv
        == '<table class="kv"><tr><th>a&lt;b</th><td>it&#x27;s &amp; &lt;i&gt;</td></tr><tr><th>n</th><td>3</td></tr></table>'
    )
    assert ("<h3>x</h3>" + kv).startswith("<h3>x</h3><table")  # a plain str: concatenating does not escape
    nested = render_string("<div>{{ frag | safe }}{{ text }}</div>", frag=kv, text="<kv>")
    assert nested == f"<div>{kv}&lt;kv&gt;</div>"
    assert render_string("{{ frag }}", frag=kv).startswith("&lt;table")  # not marked safe: escaped
