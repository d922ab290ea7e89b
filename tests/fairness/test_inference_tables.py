"""Inference in the audit's outputs: G and the inference beside every coefficient, the G < 20 warning."""

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from posfair.fairness.analysis import few_clusters_message, fit_all
from posfair.fairness.audit_result import AuditResult
from posfair.fairness.audit_tables import coefficient_detail_table, coefficient_table
from posfair.report.html import render_report
from posfair.report.tables import to_csv, to_latex, to_markdown
from posfair.stats.inference import FewClustersWarning, Inference, significance_mark


def _observations(sets_by_n=None, seed=0):
    """Synthetic observations: per instance (n, config) G segment sets (no topic in two sets), every ordering once."""
    import itertools

    sets_by_n = sets_by_n or {3: 24, 4: 6}
    rng = np.random.default_rng(seed)
    rows = []
    for n, G in sets_by_n.items():
        for config, key in (("en", "en"), ("[de, en, ..., en]", "de-en")):
            for s in range(G):
                u = rng.normal(0, 0.03)
                for k, perm in enumerate(itertools.permutations(range(n))):
                    for p in range(1, n + 1):
                        y = 0.7 - 0.004 * (p - 1) + u + rng.normal(0, 0.01)
                        rows.append(dict(calibration="stock", setting="main", n=n, config=config, config_key=key,
                                         doc_id=f"{n}-{key}-{s}-{k}", set_id=f"{n}-{key}-set{s:02d}", position=p,
                                         topic=f"{n}-{key}-set{s:02d}-t{perm[p - 1]}",
                                         sigma=y, tau=np.nan))  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def obs():
    return _observations()


def _fit_quiet(obs, inference=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)
        return fit_all(obs, ["sigma"], inference or Inference(clusters="set+topic"))


def test_fit_all_matches_statsmodels_and_reports_g(obs):
    coefs = _fit_quiet(obs)
    for (n, config), g in obs.groupby(["n", "config"]):
        X = pd.DataFrame(
            {"const": 1.0, **{f"p{p}": (g["position"] == p).astype(float).to_numpy() for p in range(2, n + 1)}}
        )
        codes = g["set_id"].astype("category").cat.codes.to_numpy()
        ref = sm.OLS(g["sigma"].to_numpy(), X).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
        c = coefs[(coefs["n"] == n) & (coefs["config"] == config)].sort_values("position")
        np.testing.assert_allclose(c["se"], ref.bse, rtol=1e-10)
        np.testing.assert_allclose(c["p"], ref.pvalues, rtol=1e-8, atol=1e-300)
        assert (c["clusters"] == g["set_id"].nunique()).all()
        assert (c["inference"] == "CR1 set+topic t(G-1)").all()
        assert c["mark"].tolist() == [significance_mark(p) for p in ref.pvalues]


def test_fit_all_warns_once_with_counts(obs):
    with pytest.warns(FewClustersWarning) as rec:
        fit_all(obs, ["sigma"])
    msgs = [str(w.message) for w in rec if issubclass(w.category, FewClustersWarning)]
    assert len(msgs) == 1
    assert "2 of 4 instances" in msgs[0] and "n=4 en: G=6" in msgs[0] and "n=4 [de, en, en, en]: G=6" in msgs[0]
    assert "n=3" not in msgs[0]  # 24 sets: enough
    many = _observations({3: 20})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coefs = fit_all(many, ["sigma"])
    assert few_clusters_message(coefs) is None


def test_tables_show_g_inference_se_p(obs):
    coefs = _fit_quiet(obs)
    kw = dict(model="m", measure="sigma", calibration="stock", setting="main", configs=["en", "[de, en, ..., en]"])
    t = coefficient_table(coefs, **kw)
    assert t.frame.loc[(4, "G (clusters)")].tolist() == ["6", "6"]
    assert t.frame.loc[(3, "G (clusters)")].tolist() == ["24", "24"]
    assert "Student's t with G-1 degrees of freedom" in t.caption
    assert "n=4 en (G=6)" in t.caption and "p-values approximate" in t.caption
    # marks in the paper layout follow the t(G-1) p-values
    hit = coefs[(coefs["n"] == 4) & (coefs["config"] == "en") & (coefs["position"] == 2)].iloc[0]
    assert t.frame.loc[(4, "β2 (2 vs. 1)"), "en"] == f"{hit['estimate']:.3f}" + (
        f" {hit['mark']}" if hit["mark"] else ""
    )
    d = coefficient_detail_table(coefs, **kw)
    assert list(d.frame.columns) == ["estimate", "SE", "t", "p", "mark", "G", "clusters", "inference"]
    row = d.frame.loc[(4, "en", "β2 (2 vs. 1)")]
    assert row["G"] == "6" and row["inference"] == "CR1 set+topic t(G-1)"
    assert float(row["p"]) == pytest.approx(hit["p"], rel=5e-3)  # 3 significant digits
    assert float(row["SE"]) == pytest.approx(hit["se"], abs=1e-4)
    for text in (to_markdown(d), to_csv(d), to_latex(d)):
        assert "CR1 set+topic t(G-1)" in text and "G" in text


def test_wild_inference_in_tables(obs):
    inf = Inference("wild", draws=199, weights="webb", seed=2, clusters="set+topic")
    coefs = _fit_quiet(obs[obs["n"] == 4], inf)
    assert set(coefs["inference"]) == {"wild WCR11 set+topic webb B=199 seed=2"}
    assert (coefs["p"] >= 1 / 200).all()
    d = coefficient_detail_table(coefs, model="m", measure="sigma", calibration="stock", setting="main", configs=["en"])
    assert "wild cluster bootstrap-t" in d.caption and "webb B=199 seed=2" in d.caption


def test_report_and_headline_carry_g_and_warning(obs, tmp_path):
    coefs = _fit_quiet(obs)
    result = AuditResult(model={"name": "m"}, corpus={"name": "c"}, settings={"inference": "cluster"}, calibrations=[],
                         observations=obs, coefficients=coefs, sampling=[])  # fmt: skip
    hf = result.headline_frame()
    # G and what a cluster is (set+topic asked for: two-way, which equals the sets here)
    assert hf.loc[(4, "en", "beta_2"), "G"] == "6 two-way" and hf.loc[(3, "en", "beta_2"), "G"] == "24 two-way"
    html = render_report("t", result.report_sections([]))
    assert '<p class="warning">Few clusters: 2 of 4 instances rest on fewer than 20 clusters' in html
    assert "Student&#x27;s t with G-1 degrees of freedom" in html or "Student's t with G-1 degrees of freedom" in html
    assert "G (clusters)" in html and ">SE</th>" in html  # (short headers carry class="nw")


def test_the_headline_shows_every_position(obs):
    coefs = _fit_quiet(obs)
    result = AuditResult(model={"name": "m"}, corpus={"name": "c"}, settings={"inference": "cluster"}, calibrations=[],
                         observations=obs, coefficients=coefs, sampling=[])  # fmt: skip
    hf = result.headline_frame()
    for n in sorted(set(obs["n"])):
        coefs_n = {c for (m, cfg, c) in hf.index if m == n}
        assert coefs_n == {f"beta_{p}" for p in range(2, n + 1)}, (n, coefs_n)


def test_captions_of_a_fresh_fit_read_its_typed_inference_and_an_old_csv_still_reads(obs, tmp_path, monkeypatch):
    """A fresh fit's coefficient rows carry the inference they used as typed values (inference_used): every caption
    of a fresh audit is written without reading a label back; coefficients.csv keeps the text only, and a saved one
    (the runs before the typed column) is still put in words by parsing that text."""
    from posfair.fairness.analysis import saved_table
    from posfair.stats.inference import InferenceLabel

    inf = Inference("wild", draws=199, weights="webb", seed=2, clusters="set+topic")
    coefs = _fit_quiet(obs, inf)
    assert set(coefs["inference_used"]) == {inf.used()} and set(coefs["inference"]) == {inf.used().text()}

    def _refuse(cls, label):
        raise AssertionError(f"a fresh fit's label was parsed: {label!r}")

    monkeypatch.setattr(InferenceLabel, "parse", classmethod(_refuse))
    kw = dict(model={"name": "m"}, corpus={"name": "c"}, settings={"inference": "wild"}, calibrations=[], sampling=[])
    fresh = AuditResult(**kw, observations=obs, coefficients=coefs)
    text = fresh.inference_text()
    assert text.startswith(inf.used().sentence()) and "webb B=199 seed=2" in text
    captions = [t.caption for t in fresh.tables()]  # the σ table and its detail table: each says its inference
    assert len(captions) == 2 and all(f"Inference: {inf.used().sentence()}" in c for c in captions)
    monkeypatch.undo()

    path = tmp_path / "coefficients.csv"
    path.write_text(saved_table(coefs).to_csv(index=False))
    saved = pd.read_csv(path)
    assert "inference_used" not in saved and list(saved["inference"]) == list(coefs["inference"])
    old = AuditResult(**kw, observations=obs, coefficients=saved)
    assert old.inference_text() == text and [t.caption for t in old.tables()] == captions
