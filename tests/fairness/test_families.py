"""posfair audit --by-family: a corpus of two document families built here; each family's sets hold only its topics,
its coefficients are those of a regression on its observations alone, the change and share removed follow from
them, Cochran's Q from the per-family rows by hand; tables, families.json, the report and the CLI."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats
from typer.testing import CliRunner

from posfair import Calibration
from posfair.cli import app
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.families import POOLED, QUANTITIES, cochran_q, families_of, family_findings, heterogeneity
from posfair.fairness.pipeline import audit
from posfair.stats.inference import FewClustersWarning
from posfair.stats.position_ols import position_design

CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)
SETTINGS = dict(n_values=(3,), configs=("en",), target_docs=18, min_segment_tokens=1, max_segment_tokens=60,
                batch_size=16, chunk_size=32, control=False)  # fmt: skip


def _two_families(make_corpus, topics=24):
    c = make_corpus(topics=topics)
    c["source"] = np.where(c["id"].str[-2:].astype(int) < topics // 2, "faq", "guide")
    return c


@pytest.fixture(scope="module")
def result(tiny_model, make_corpus, tmp_path_factory):
    settings = AuditSettings(**SETTINGS, family_field="source")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)  # 3 segment sets per family
        return audit(
            tiny_model("bert-mean"), _two_families(make_corpus), settings, [CAL], cache_dir=tmp_path_factory.mktemp("c")
        )


def test_each_family_draws_its_own_sets(result, make_corpus):
    obs = result.observations
    assert families_of(obs) == ["faq", "guide"]
    family_of_topic = _two_families(make_corpus).drop_duplicates("id").set_index("id")["source"]
    assert (obs["topic"].map(family_of_topic) == obs["family"]).all()  # a set holds only its family's topics
    assert obs.groupby("set_id")["family"].nunique().max() == 1
    assert obs.groupby("family")["set_id"].nunique().to_dict() == {"faq": 3, "guide": 3}
    assert {s["instance"] for s in result.sampling} == {"n3-en@faq", "n3-en@guide"}
    # the coefficient tables pool the families: one regression over both families' 6 sets
    assert set(result.coefficients["clusters"]) == {6}


def test_family_findings_against_regressions_on_each_family_alone(result):
    found = result.family_findings()
    obs = result.observations
    assert set(found["family"]) == {"faq", "guide", POOLED}
    for family in ("faq", "guide", POOLED):
        part = obs if family == POOLED else obs[obs["family"] == family]
        beta = {}
        for cal in ("stock", CAL.label()):
            g = part[part["calibration"] == cal]
            beta[cal] = sm.OLS(g["sigma"].to_numpy(), position_design(g["position"].to_numpy(), 3)).fit().params
        for p in (2, 3):
            row = found[(found["family"] == family) & (found["position"] == p)].iloc[0]
            s, c = beta["stock"][p - 1], beta[CAL.label()][p - 1]
            assert row["stock_estimate"] == pytest.approx(s, abs=1e-12)
            assert row["calibrated_estimate"] == pytest.approx(c, abs=1e-12)
            assert row["change_estimate"] == pytest.approx(c - s, abs=1e-12)
            assert row["share_estimate"] == pytest.approx(1 - c / s, rel=1e-9)
            assert row["change_ci_low"] <= row["change_estimate"] <= row["change_ci_high"]
            assert row["sets"] == (6 if family == POOLED else 3) and row["shared_topics"] == 0
            assert row["change_G"] == row["sets"] and row["change_clusters"].startswith("sets (")


def test_heterogeneity_is_cochrans_q_of_the_family_rows_by_hand(result):
    found = result.family_findings()
    het = result.family_heterogeneity()
    for p in (2, 3):
        fam = found[(found["family"] != POOLED) & (found["position"] == p)]
        x, se = fam["change_estimate"].to_numpy(), fam["change_se"].to_numpy()
        w = 1 / se**2
        q = float(np.sum(w * (x - np.sum(w * x) / np.sum(w)) ** 2))
        row = het[(het["position"] == p) & (het["quantity"] == "change")].iloc[0]
        assert row["Q"] == pytest.approx(q, rel=1e-10)
        assert row["p"] == pytest.approx(stats.chi2.sf(q, 1), rel=1e-10) and row["df"] == 1
    assert cochran_q([0.1], [0.01])["k"] == 1 and np.isnan(cochran_q([0.1], [0.01])["Q"])


def test_an_audit_without_families_gives_pooled_rows_only(result):
    obs = result.observations.drop(columns="family")
    found = family_findings(obs)
    assert set(found["family"]) == {POOLED}
    assert heterogeneity(found).empty


def test_saved_tables_json_and_report(result, tmp_path):
    paths = result.save(tmp_path / "out")
    data = json.loads(paths["families"].read_text())
    assert {r["family"] for r in data["findings"]} == {"faq", "guide", POOLED}
    assert {r["quantity"] for r in data["heterogeneity"]} == {"β stock", "β calibrated", "change", "share removed"}
    # the heterogeneity written is Cochran's Q of the saved per-family findings, by hand, row for row in the table
    found = pd.DataFrame(data["findings"])
    found = found[found["family"] != POOLED]
    quantity = {label: q for q, label in QUANTITIES.items()}
    for h in data["heterogeneity"]:
        g = found[(found["n"] == h["n"]) & (found["config"] == h["config"]) & (found["position"] == h["position"])]
        g = g[g["calibration"].isna()] if h["calibration"] is None else g[g["calibration"] == h["calibration"]]
        x, se = g[f"{quantity[h['quantity']]}_estimate"].to_numpy(), g[f"{quantity[h['quantity']]}_se"].to_numpy()
        w = 1 / se**2
        assert len(x) == 2 and h["Q"] == pytest.approx(np.sum(w * (x - np.sum(w * x) / np.sum(w)) ** 2), rel=1e-9)
    table = pd.read_csv(tmp_path / "out" / "tables" / "families_heterogeneity.csv", dtype=str)
    assert table["Q"].tolist() == [f"{h['Q']:.2f}" for h in data["heterogeneity"]]
    md = (tmp_path / "out" / "tables" / "families.md").read_text()
    assert all(f"{e:+.3f} [" in md for e in found["stock_estimate"])  # every family's β stock is in the table
    html = paths["report"].read_text()
    assert "Per document family" in html and "Heterogeneity across document families" in html


def test_cli_by_family(tmp_path, tiny_model_path, make_corpus):
    path, _ = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    _two_families(make_corpus).to_parquet(corpus)
    base = ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "3", "--langs", "en", "--docs", "12",
            "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--calibration", "8,0.5,1.0"]  # fmt: skip
    res = CliRunner().invoke(app, [*base, "--by-family", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "Per document family" in res.output and "Heterogeneity across document families" in res.output
    assert (tmp_path / "out" / "families.json").exists()
    # bad input: one line naming the option, exit 2, before any work
    res = CliRunner().invoke(app, [*base, "--by-family", "--family-field", "nope", "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "--family-field nope: corpus" in res.output and "no column 'nope'" in res.output
    res = CliRunner().invoke(app, [*base, "--family-field", "source", "--out", str(tmp_path / "o3")])
    assert res.exit_code == 2 and "--family-field source: applies only with --by-family" in res.output
    one = _two_families(make_corpus).assign(source="faq")
    one.to_parquet(corpus)
    res = CliRunner().invoke(app, [*base, "--by-family", "--out", str(tmp_path / "o4")])
    assert res.exit_code == 2 and "has one family in 'source' (faq)" in res.output
    assert not (tmp_path / "o4").exists()


def test_a_short_mixed_configuration_is_written_out_in_the_family_tables(result):
    """The family and heterogeneity tables name a mixed configuration as every other table does: in full where
    that is no longer than the ellipsis (n = 3: [de, en, en]), with the ellipsis where it saves room (n = 6)."""
    from posfair.fairness.family_report import family_table, heterogeneity_table

    found, het = result.family_findings(), result.family_heterogeneity()
    for n, written in ((3, "[de, en, en]"), (6, "[de, en, ..., en]")):
        mixed = found.assign(config="[de, en, ..., en]", n=n)
        rows = family_table(mixed, "m").frame.index.get_level_values("configuration")
        assert set(rows) == {written}
        rows = heterogeneity_table(het.assign(config="[de, en, ..., en]", n=n), "m").frame.index
        assert set(rows.get_level_values("configuration")) == {written}
