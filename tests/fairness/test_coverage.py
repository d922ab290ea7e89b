"""Calibrated share in the audit (tables, report, figure, warnings) and in the attention profile (labels, figures)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from posfair import Calibration
from posfair import encoding as enc
from posfair.attention.profile import AttentionProfile, attention_profile
from posfair.calibration.coverage import NOOP_LABEL, CalibrationFallbackWarning
from posfair.fairness.experiment import AuditSettings, build_instances, make_model_info
from posfair.fairness.pipeline import audit

SETTINGS = AuditSettings(
    n_values=(3,),
    configs=("en",),
    target_docs=12,
    min_segment_tokens=1,
    max_segment_tokens=60,
    batch_size=4,
    chunk_size=4,
)
FULL = Calibration(basket_size=4, layers=0.5, strength=1.0)
NOOP = Calibration(basket_size=4096, layers=1, strength=1.0)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("bert-mean")


@pytest.fixture(scope="module")
def corpus(make_corpus):
    return make_corpus(topics=8)


@pytest.fixture(scope="module")
def lengths(model, corpus):
    """Token counts of the audit's documents as the model encodes them (mean pooling: all of them are content)."""
    info = make_model_info(model, SETTINGS)
    docs = [
        d for inst in build_instances(corpus, SETTINGS, enc.model_tokenizer(model), info.limit) for d in inst.documents
    ]
    counted = np.array([d.n_tokens for d in docs])
    assert model.encoded_lengths([d.text for d in docs]).tolist() == counted.tolist()  # what the engine sees
    return counted


@pytest.fixture(scope="module")
def partial(lengths):
    return Calibration(basket_size=int(np.median(lengths)), layers=0.5, strength=1.0)


@pytest.fixture(scope="module")
def run(model, corpus, partial, tmp_path_factory):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = audit(model, corpus, SETTINGS, [FULL, partial, NOOP], cache_dir=tmp_path_factory.mktemp("cache"))
    return result, [str(w.message) for w in caught if issubclass(w.category, CalibrationFallbackWarning)]


def test_audit_reports_the_share_once_per_calibration(run, lengths, partial):
    result, messages = run
    n = len(lengths)
    k = int(
        (lengths >= partial.basket_size + 1).sum()
    )  # calibrated iff n_tokens >= B + 1 (mean pooling, one basket = identity)
    assert 0 < k < n
    assert messages == [  # no per-encode-call warning: one line per calibration that left documents stock
        f"calibration {partial.label()}: calibrated share {k / n:.3f} ({k} of {n} documents; {n - k} encoded stock)",
        f"calibration {NOOP.label()}: calibrated share 0.000 (0 of {n} documents; {NOOP_LABEL}, its figures are the stock model's)",
    ]
    cov = result.coverage().set_index("calibration")
    assert np.isnan(cov.loc["stock", "calibrated_share"])
    assert cov.loc[FULL.label(), "calibrated_share"] == 1.0
    assert cov.loc[partial.label(), "calibrated_share"] == pytest.approx(k / n)
    assert (cov.loc[NOOP.label(), "calibrated"], cov.loc[NOOP.label(), "documents"]) == (0, n)
    assert result.noop_calibrations() == [NOOP.label()]
    assert result.headline()[f"{partial.label()}_calibrated_share"] == pytest.approx(k / n)
    fid = result.fidelity().set_index(["calibration", "setting"])
    assert fid.loc[(partial.label(), "main"), "calibrated_share"] == pytest.approx(k / n)
    assert fid.loc[(partial.label(), "control"), "calibrated_share"] == pytest.approx(k / n)


def test_tables_report_and_figure_carry_the_share(run, lengths, partial, tmp_path):
    result, _ = run
    n, k = len(lengths), int((lengths >= partial.basket_size + 1).sum())
    tables = {t.name: t for t in result.tables()}
    noop_sigma = tables[f"sigma_{NOOP.label()}_main"]
    assert NOOP_LABEL in noop_sigma.title
    assert noop_sigma.frame.loc[(3, "calibrated share"), "en"] == "0.000"
    assert tables[f"sigma_{partial.label()}_main"].frame.loc[(3, "calibrated share"), "en"] == f"{k / n:.3f}"
    assert tables["sigma_stock_main"].frame.loc[(3, "calibrated share"), "en"] == "—"
    coverage = tables["coverage"].frame
    assert coverage.loc[(partial.label(), 3, "en")].tolist() == [str(n), str(k), f"{k / n:.3f}"]
    assert tables["fidelity"].frame["calibrated share"].tolist()[0] == "—"  # the stock row
    paths = result.save(tmp_path)
    for kind in ("md", "csv", "tex"):
        assert "calibrated" in paths[f"table:coverage.{kind}"].read_text()
    assert "calibrated share" in paths[f"table:sigma_{partial.label()}_main.tex"].read_text()
    html = paths["report"].read_text()
    assert "calibrated share" in html and f"calibration {NOOP.label()}: calibrated share 0.000" in html
    # the profile figure: the no-op variant is named in the legend but not drawn over the stock line
    fig = result.figure()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"σ {NOOP.label()} — {NOOP_LABEL}, = stock" in legend
    drawn = [line for line in fig.axes[0].lines if len(line.get_xdata())]
    assert len(drawn) == 2 * 3  # σ and τ of stock, FULL and the partial calibration


def test_attention_profile_counts_and_labels_a_noop(tiny_model, tmp_path):
    from posfair.attention.render import plot_baskets, plot_view, summary_html

    model = tiny_model("bert")  # CLS pooling: BOS isolated at its original mass -> calibrated iff n_tokens >= B + 2
    docs = [" ".join(["word"] * k) for k in (6, 10, 30)]  # 8, 12, 32 tokens with [CLS] and [SEP]
    assert model.token_lengths(docs).tolist() == [8, 12, 32]
    cal = Calibration(basket_size=10, layers=2, strength=1.0)
    with pytest.warns(CalibrationFallbackWarning, match="1 of 3 texts are shorter than one basket"):
        partial = attention_profile(model, docs, basket_size=4, calibration=cal)
    assert partial.n_calibrated == 2 and partial.calibrated_share == pytest.approx(2 / 3)
    stock = attention_profile(model, docs, basket_size=4)
    assert stock.n_calibrated is None and np.isnan(stock.calibrated_share)
    noop = attention_profile(
        model, docs, basket_size=4, calibration=Calibration(basket_size=31, layers=2, strength=1.0)
    )
    assert noop.n_calibrated == 0 and noop.noop  # 32 tokens = BOS + exactly one basket of 31: the identity
    np.testing.assert_allclose(noop.mean("basket"), stock.mean("basket"), atol=1e-6)
    noop.save(tmp_path / "p")
    assert AttentionProfile.load(tmp_path / "p").n_calibrated == 0
    # plot_baskets: axes[0] = BOS/EOS bars, axes[1] = baskets; plot_view: axes[0] = bins
    for fig, ax_index in ((plot_baskets([stock, noop, partial]), 1), (plot_view([stock, noop, partial], "bin"), 0)):
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert (
            f"{noop.label} — {NOOP_LABEL} (= stock, not drawn)" in legend
            and f"{cal.label()} (calibrated share 0.667)" in legend
        )
        ax = fig.axes[ax_index]
        assert (
            len([line for line in ax.lines if len(line.get_xdata())]) == 2
        )  # stock and the partial one; the no-op is not drawn
    html = summary_html([stock, noop, partial])
    assert (
        "<th>calibrated share</th>" in html
        and "<td>0.000</td>" in html
        and "<td>0.667</td>" in html
        and "<td>—</td>" in html
    )
