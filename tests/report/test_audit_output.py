"""The audit's report page and figures read by what they show (issue 40): every table inside the page, the method
note once, titles above the panels in a larger type than theirs, the data drawn equal to the audit's numbers, and
a stock-only run that draws no trade-off of one point."""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest

from fairness.conftest import assert_matches_by_hand, tiny_corpus
from posfair import Calibration
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.pipeline import audit

CAL = Calibration(basket_size=4, layers=1.0, strength=1.0)
SETTINGS = AuditSettings(n_values=(3,), configs=("de:en",), target_docs=18, min_segment_tokens=1, max_segment_tokens=60,
                         batch_size=8, chunk_size=8)  # fmt: skip


@pytest.fixture(scope="module")
def results(tiny_model, tmp_path_factory):
    """(calibrated audit, stock-only audit) of a mixed de:en instance of 3 segment sets."""
    model, corpus = tiny_model("bert-mean"), tiny_corpus(topics=9)
    cache = tmp_path_factory.mktemp("cache")
    return audit(model, corpus, SETTINGS, [CAL], cache_dir=cache), audit(model, corpus, SETTINGS, [], cache_dir=cache)


def _section(html: str, title: str) -> str:
    start = html.index(f">{title}</h2>")
    end = html.find("<h2>", start)
    return html[start : end if end > 0 else len(html)]


def test_the_report_page_keeps_its_tables_inside_and_says_the_method_once(results):
    from posfair.report.html import render_report

    result = results[0]
    html = render_report("audit", result.report_sections())
    # every table in a box that scrolls sideways instead of running past the page; titles above, not in, a table
    assert html.count('<table class="coef">') == html.count('<div class="scroll"><table class="coef">') > 5
    assert "<caption>" not in html and "div.scroll { max-width: 100%; overflow-x: auto; }" in html
    # cells and short headers stay on one line ("max |β|", "B4-Lall-a1 (control)"); the calibration JSON wraps
    assert "th.nw, table.coef td { white-space: nowrap; }" in html and "pre { white-space: pre-wrap;" in html
    assert '<th class="nw">max |β|</th>' in html and f"<td>{CAL.label()} (control)</td>" in html
    # sampling: the columns named in words, the empty family column left out
    sampling = _section(html, "Documents")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", sampling)
    assert "topics available" in headers and "segments outside window" in headers and "configuration" in headers
    assert not [h for h in headers if "_" in h] and "family" not in headers
    # the method, inference and marks (60 words) once above the OLS tables, not under each of them
    ols = _section(html, "OLS tables")
    assert ols.count("Inference: CR1 cluster-robust") == 1  # the tables' method note, once above them
    assert ols.count("Statistical significance") == 1 and ols.count("positional fairness (σ") >= 2


def test_the_profile_figure_draws_the_cluster_means_under_a_title_larger_than_its_panels(results):
    from posfair.fairness.audit_report import profile_figure
    from posfair.report.plots import figure_heading, layout_problems

    result = results[0]
    fig = profile_figure(result)
    assert layout_problems(fig) == []
    obs = result.observations
    drawn = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    for cal in ("stock", CAL.label()):
        for m, mark in (("sigma", "σ"), ("tau", "τ")):
            d = obs[(obs.calibration == cal) & (obs.setting == "main")]
            expected = d.groupby(["position", "set_id"])[m].mean().groupby("position").mean()  # set means, then mean
            line = drawn[f"{mark} {cal}"]
            np.testing.assert_allclose(line.get_xdata(), expected.index.to_numpy())
            np.testing.assert_allclose(line.get_ydata(), expected.to_numpy())
    panel = fig.axes[0]
    assert set(obs.n) == {3}  # one n: the column is named as the tables name it (several n: [de, en, ..., en])
    assert panel.get_title() == "[de, en, en]"
    assert fig._suptitle.get_fontsize() > max(ax.title.get_fontsize() for ax in fig.axes if ax.get_title())
    heading_lines = sum(t.get_text().count("\n") + 1 for t in fig.texts if t.get_va() == "top")
    assert heading_lines <= 3, figure_heading(fig)
    bundled = copy.copy(result)
    bundled.corpus = {**result.corpus, "name": "bundled"}
    assert "bundled corpus (Debian documentation)" in figure_heading(profile_figure(bundled))


def test_the_fidelity_figure_draws_each_variants_spread_and_recall(results):
    from matplotlib.collections import PathCollection

    from posfair.fairness.audit_report import fidelity_figure
    from posfair.report.plots import layout_problems

    result = results[0]
    fig = fidelity_figure(result)
    assert layout_problems(fig) == []
    (ax,) = fig.axes
    assert ax.get_title() == "n = 3, [de, en, en]"
    points = {c.get_label(): c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)}
    obs = result.observations
    for cal, label in (("stock", "stock"), (CAL.label(), "calibrated")):
        d = obs[(obs.calibration == cal) & (obs.setting == "main")]
        means = d.groupby("position")["sigma"].mean()
        recall = d.drop_duplicates("doc_id")["recall"].mean()
        np.testing.assert_allclose(points[label], [[means.max() - means.min(), recall]])


def test_a_stock_only_audit_draws_no_trade_off_and_says_why(results, tmp_path):
    from posfair.fairness.audit_report import fidelity_figure
    from posfair.report.plots import layout_problems

    stock_only = results[1]
    fig = fidelity_figure(stock_only)
    assert layout_problems(fig) == []
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert legend == ["stock"]  # no "calibrated" entry without points
    paths = stock_only.save(tmp_path / "out")
    assert not (tmp_path / "out" / "figures" / "fidelity.png").exists() and "figure:fidelity" not in paths
    assert "Stock model only: no calibration to set against it" in paths["report"].read_text()
    # the fidelity numbers are written all the same: each one as computed by hand from the observations
    written = pd.read_csv(tmp_path / "out" / "fidelity.csv")
    assert set(written["calibration"]) == {"stock"} and written["calibrated_share"].isna().all()
    assert_matches_by_hand(written, stock_only.observations)


def test_the_demo_index_gives_each_parts_headline_numbers(results, tmp_path):
    from posfair.cli.demo import _write_index

    result = results[0]
    index = _write_index(tmp_path, [("english", "tiny", result, {}, 12.0)]).read_text()
    obs = result.observations
    for cal in ("stock", CAL.label()):
        d = obs[(obs.calibration == cal) & (obs.setting == "main")]
        means = d.groupby("position")["sigma"].mean()
        assert f"{means.max() - means.min():.3f}" in index  # the σ profile spread
        assert f"{d.drop_duplicates('doc_id')['recall'].mean():.3f}" in index  # own-segment recall@n
    coefs = result.coefficients
    beta2 = coefs[(coefs.measure == "sigma") & (coefs.setting == "main") & (coefs.position == 2)]
    for estimate in beta2["estimate"]:
        assert f"{estimate:.3f}" in index.replace("−", "-")
    assert 'href="english/report.html"' in index


def _tables(html: str) -> str:
    """Every table of the page (headers and cells), tags left out."""
    return " ".join(re.sub(r"<[^>]+>", " ", t) for t in re.findall(r"<table.*?</table>", html, flags=re.S))


def _words(html: str) -> str:
    """What a reader of the page reads: its text without the style sheet and the tags."""
    return re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", "", html, flags=re.S))


def test_sigma_and_tau_are_written_one_way_in_tables_captions_and_figures(results):
    """One vocabulary (issue 40 item 7): the OLS captions say σ and τ as the headline, the fidelity table and the
    figures do, never "sigma" / "tau"."""
    from matplotlib.text import Text

    from posfair.fairness.audit_report import fidelity_figure, profile_figure
    from posfair.report.html import render_report

    result = results[0]
    assert set(result.measures) == {"sigma", "tau"}
    words = _words(render_report("audit", result.report_sections()))
    assert "positional fairness (σ = cos(document, standalone segment))" in words
    assert "information retention (τ = cos(standalone, contextualised segment))" in words
    assert re.findall(r"\b(?:sigma|tau)\b", words) == []
    for fig in (profile_figure(result), fidelity_figure(result)):
        texts = (
            " ".join(t.get_text() for t in fig.findobj(Text))
            + " "
            + " ".join(line.get_label() for ax in fig.axes for line in ax.get_lines())
        )
        assert "σ" in texts and re.findall(r"\b(?:sigma|tau)\b", texts) == []


def test_the_headline_and_ols_tables_name_their_rows_in_words(results, tmp_path):
    """The headline names its rows as the OLS tables do ("β2 (2 vs. 1)", not "beta_2"; "configuration",
    "coefficient"), and the OLS tables' share row is "calibrated share", explained in the caption; the demo
    index's headline too.  The cells are the audit's coefficients."""
    from posfair.cli.demo import _write_index
    from posfair.fairness.audit_tables import format_estimate
    from posfair.report.html import render_report

    result = results[0]
    html = render_report("audit", result.report_sections())
    index = _write_index(tmp_path, [("mixed", "tiny", result, {}, 12.0)]).read_text()
    coefs = result.coefficients
    main = coefs[(coefs.measure == "sigma") & (coefs.setting == "main")]
    for page in (_section(html, "Summary"), index):
        headline = page[page.index("β_p") :]
        headline = headline[: headline.index("</table>")]
        headers = re.findall(r"<th[^>]*>([^<]*)</th>", headline)
        assert headers[:3] == ["n", "configuration", "coefficient"], headers
        rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", headline, re.S)]
        rows = [r for r in rows if r]
        assert [r[2] for r in rows] == ["β2 (2 vs. 1)", "β3 (3 vs. 1)"]
        for r, p in zip(rows, (2, 3), strict=True):
            for k, cal in enumerate(("stock", CAL.label())):
                hit = main[(main.calibration == cal) & (main.position == p)].iloc[0]
                assert r[3 + k] == format_estimate(hit["estimate"], hit["mark"], 3)
    assert "beta_" not in _words(html) and "beta_" not in _words(index)
    ols = _section(html, "OLS tables")
    assert "<td>calibrated share</td>" in ols and "calibrated_share" not in _words(html)
    assert "calibrated share: the fraction of the instance's documents the calibration changed" in ols.replace(
        "&#x27;", "'"
    )


def test_the_terminal_summary_names_its_rows_as_the_report_does(results):
    """``posfair audit``'s terminal table: configuration and coefficient as in the report's headline."""
    from posfair.cli.runs import summary_table

    header, rows = summary_table(results[0])
    assert header[:3] == ["n", "configuration", "coefficient"]
    assert [r[1:3] for r in rows] == [["[de, en, en]", "β2 (2 vs. 1)"], ["[de, en, en]", "β3 (3 vs. 1)"]]


def test_a_short_mixed_configuration_is_written_out_in_every_table(results):
    """n = 3: "[de, en, en]" in every table of the page (headline, OLS, detail, fidelity, coverage, sampling) and
    its few-clusters line, not "[de, en, ..., en]", which is longer; the ellipsis only where it saves room (n = 5) or the column holds
    several n."""
    from posfair.report.html import render_report

    result = results[0]
    html = render_report("audit", result.report_sections())
    page = html[: html.index(">Run parameters</h2>")]  # (the settings as given are the run's record)
    assert _tables(page).count("[de, en, en]") >= 6 and "[de, en, ..., en]" not in _words(page)
    assert "n=3 [de, en, en]: G=3" in result.few_clusters_message()  # the few-clusters line over the tables too
    from posfair.fairness.audit_tables import coefficient_table, config_label  # the rule itself

    assert config_label("[de, en, ..., en]", 4) == "[de, en, en, en]"  # as long as the ellipsis: written out
    assert config_label("[de, en, ..., en]", 5) == "[de, en, ..., en]"  # shorter than [de, en, en, en, en]
    assert config_label("[de, en, ..., en]") == "[de, en, ..., en]" and config_label("en", 3) == "en"
    two_n = result.coefficients.assign(n=5)
    two_n = pd.concat([result.coefficients, two_n])
    kw = dict(model="m", measure="sigma", calibration="stock", setting="main", configs=["[de, en, ..., en]"])
    assert list(coefficient_table(result.coefficients, **kw).frame.columns) == ["[de, en, en]"]
    assert list(coefficient_table(two_n, **kw).frame.columns) == ["[de, en, ..., en]"]  # n = 3 and 5 in one column


def test_the_few_clusters_box_is_said_once_per_page(results):
    """Issue 49 item 5: the few-clusters warning was boxed in the summary, above the OLS tables and again; once now,
    in the summary (the tables' own G rows say each instance's clusters)."""
    from posfair.report.html import render_report

    html = render_report("audit", results[0].report_sections())
    assert results[0].few_clusters_message()
    assert html.count('<p class="warning">Few clusters:') == 1
    assert 'class="warning">Few clusters:' in _section(html, "Summary")


def test_a_stock_only_reports_profile_caption_says_stock_only(results, tmp_path):
    """Issue 49 item 5: a stock-only run's profile figure was captioned "Stock and calibrated runs"."""
    stock_only = results[1]
    assert not stock_only.calibrations
    html = stock_only.save(tmp_path / "stock")["report"].read_text()
    assert "Stock and calibrated runs" not in html and "The stock run (no calibration was asked for)." in html
    calibrated = results[0].save(tmp_path / "calibrated")["report"].read_text()
    assert "Stock and calibrated runs" in calibrated
