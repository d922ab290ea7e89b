"""The language grid: document construction, the pooled language regression, the β2 grid and the report section."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats

from posfair import Calibration
from posfair import encoding as enc
from posfair.fairness.documents import LanguageConfig, language_grid
from posfair.fairness.experiment import AuditSettings, build_instances
from posfair.fairness.language import fit_language_ols, has_language_grid, language_effects, segment_tokens
from posfair.fairness.language_tables import beta2_grid, grid_languages, grid_matrices
from posfair.fairness.pipeline import audit
from posfair.runtime.errors import PosfairInputError
from posfair.stats.inference import FewClustersWarning

LANGS = ("en", "de", "fr")
CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)
SETTINGS = AuditSettings(n_values=(3,), configs=language_grid(LANGS), target_docs=12, min_segment_tokens=1, max_segment_tokens=60,
                         batch_size=16, chunk_size=32, control=False)  # fmt: skip


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("bert-mean")


@pytest.fixture(scope="module")
def corpus(make_corpus):
    return make_corpus(topics=9, langs=LANGS)


@pytest.fixture(scope="module")
def result(model, corpus, tmp_path_factory):
    with pytest.warns(FewClustersWarning, match="9 of 9 instances"):  # 2 segment sets per instance
        return audit(model, corpus, SETTINGS, [CAL], cache_dir=tmp_path_factory.mktemp("cache"))


def test_language_grid_has_every_pair_and_the_baselines():
    grid = language_grid(["en", "de", "ja", "de"])
    assert grid[:3] == (LanguageConfig("en", "en"), LanguageConfig("de", "de"), LanguageConfig("ja", "ja"))
    pairs = {(c.lead, c.later) for c in grid[3:]}
    assert pairs == {(a, b) for a, b in itertools.permutations(["en", "de", "ja"], 2)}
    assert len(grid) == 3 + 3 * 2 and all(c.mixed for c in grid[3:])
    with pytest.raises(PosfairInputError, match="at least 2 languages"):
        language_grid(["en"])


def test_grid_documents_put_each_language_at_its_positions(model, corpus):
    instances = build_instances(corpus, SETTINGS, enc.model_tokenizer(model), 256)
    assert {(i.config.lead, i.config.later) for i in instances} == {(a, b) for a in LANGS for b in LANGS}
    text = {(r.id, r.lang): r.text for r in corpus.itertuples(index=False)}
    for inst in instances:
        lead, later = inst.config.lead, inst.config.later
        assert len(inst.documents) == 6 * len(inst.sets) >= 12
        for d in inst.documents:
            assert d.langs == (lead, later, later)
            for pos, (topic, lang, seg, sid, (a, b)) in enumerate(
                zip(d.topics, d.langs, d.texts, d.segment_ids, d.spans, strict=True)
            ):
                assert (
                    seg == text[(topic, lang)] == d.text[a:b]
                )  # the segment at this position is the topic in that language
                assert sid == f"{lang}:{topic}"
                assert lang == (lead if pos == 0 else later)
        # every ordering of every set, each topic once at each position per (n-1)! orderings
        for s in inst.sets:
            perms = sorted(d.permutation for d in inst.documents if d.set_id == s.set_id)
            assert perms == sorted(itertools.permutations(range(3)))


def _direct_fit(obs: pd.DataFrame, calibration: str, length: bool, measure: str = "sigma", clusters: str = "set+topic"):
    """The pooled regression written as a statsmodels formula (independent of posfair's design matrix), clustered
    by set and topic (two group columns) or by set."""
    g = obs[(obs["calibration"] == calibration) & (obs["setting"] == "main") & (obs["position"] >= 2)].copy()
    g["tok_c"] = g["seg_tokens"] - g["seg_tokens"].mean()
    formula = f"{measure} ~ C(lang, Treatment('en')) + C(position) + C(lead_lang, Treatment('en'))" + (
        " + tok_c" if length else ""
    )
    codes = pd.factorize(g["set_id"])[0]
    if clusters == "set+topic":
        codes = np.column_stack([codes, pd.factorize(g["topic"])[0]])
    return smf.ols(formula, data=g).fit(cov_type="cluster", cov_kwds={"groups": codes}, use_t=True), g


def _psd_se(direct) -> np.ndarray:
    """Standard errors of statsmodels' covariance after Cameron-Gelbach-Miller's eigenvalue fix, by hand (a two-way
    covariance need not be positive semi-definite)."""
    w, U = np.linalg.eigh(direct.cov_params().to_numpy())
    return np.sqrt(np.diag((U * np.clip(w, 0, None)) @ U.T))


@pytest.mark.parametrize(("calibration", "measure"), [("stock", "sigma"), (CAL.label(), "sigma"), ("stock", "margin")])
@pytest.mark.parametrize("length", [False, True])
@pytest.mark.parametrize("clusters", ["set+topic", "set"])
def test_pooled_language_regression_matches_statsmodels_formula(result, calibration, measure, length, clusters):
    fit = fit_language_ols(
        result.observations, n=3, measure=measure, calibration=calibration, control_length=length, clusters=clusters
    )
    direct, g = _direct_fit(result.observations, calibration, length, measure, clusters)
    assert fit.reference == "en" and fit.nobs == len(g) == 2 * g["doc_id"].nunique()
    # the instances of a grid draw their sets from the same topics: two-way G = the topics, fewer than the sets
    G = min(g["set_id"].nunique(), g["topic"].nunique()) if clusters == "set+topic" else g["set_id"].nunique()
    assert fit.n_clusters == G and (clusters == "set" or G < g["set_id"].nunique())
    names = {f"later:{lang}": f"C(lang, Treatment('en'))[T.{lang}]" for lang in ("de", "fr")}
    names |= {f"lead:{lang}": f"C(lead_lang, Treatment('en'))[T.{lang}]" for lang in ("de", "fr")}
    names |= {"position:3": "C(position)[T.3]", "intercept": "Intercept"} | ({"tokens": "tok_c"} if length else {})
    assert sorted(fit.names) == sorted(names)
    se = _psd_se(direct)
    if not np.allclose(se, direct.bse, rtol=1e-12, equal_nan=True):
        assert clusters == "set+topic" and "positive semi-definite" in fit.cluster_by
    p = 2 * stats.t.sf(np.abs(direct.params / se), fit.n_clusters - 1)
    for k, name in enumerate(fit.names):
        i = list(direct.params.index).index(names[name])
        assert fit.params[k] == pytest.approx(direct.params[names[name]], abs=1e-10)
        assert fit.bse[k] == pytest.approx(se[i], rel=1e-8)
        assert fit.pvalues[k] == pytest.approx(np.asarray(p)[i], rel=1e-6, abs=1e-300)


def test_language_effects_and_tokens_table(result):
    eff = language_effects(result.observations)
    assert set(eff["calibration"]) == {"stock", CAL.label()}
    ref = eff[eff["is_reference"]]
    assert set(ref["language"]) == {"en"} and (ref["estimate"] == 0).all()
    direct, _ = _direct_fit(result.observations, "stock", False)
    de = eff[(eff["calibration"] == "stock") & (~eff["length_adjusted"]) & (eff["language"] == "de")].iloc[0]
    assert de["estimate"] == pytest.approx(direct.params["C(lang, Treatment('en'))[T.de]"], abs=1e-10)
    tok = segment_tokens(result.observations).set_index("language")
    obs = result.observations
    segs = obs[obs["calibration"] == "stock"].drop_duplicates("segment_id")
    for lang in LANGS:
        assert tok.loc[lang, "mean_tokens"] == pytest.approx(segs.loc[segs["lang"] == lang, "seg_tokens"].mean())


def test_beta2_grid_is_the_per_instance_coefficient(result):
    grid = beta2_grid(result.coefficients, calibration="stock", n=3)
    assert len(grid) == 9
    for r in grid.itertuples(index=False):
        config = r.lead if r.lead == r.later else f"[{r.lead}, {r.later}, ..., {r.later}]"
        direct = result.ols(n=3, config=config)  # the instance's own regression
        assert r.estimate == pytest.approx(direct.params[1], abs=1e-12)
        assert r.clusters == direct.n_clusters
    values, labels = grid_matrices(grid, list(LANGS))
    assert values.loc["de", "fr"] == grid[(grid.lead == "de") & (grid.later == "fr")]["estimate"].iloc[0]
    assert np.isfinite(values.to_numpy()).all() and (labels != "").all().all()


def test_report_has_the_language_section(result, tmp_path):
    assert has_language_grid(result.observations)
    paths = result.save(tmp_path / "out")
    html = paths["report"].read_text()
    assert "Languages" in html and "language effect on σ at equal position" in html
    assert (tmp_path / "out" / "figures" / "language_beta2_n3.png").exists()
    from posfair.fairness.language_report import _figure
    from posfair.report.plots import layout_problems

    fig = _figure(result, 3)  # drawn at its real size: cell values with their G, nothing off the canvas
    assert layout_problems(fig) == []
    cells = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert cells and all("\nG=" in c for c in cells)
    # the stock panel's cells are each instance's own regression: β2 of σ for lead (row) and later (column) language
    stock = np.ma.filled(next(ax.get_images()[0].get_array() for ax in fig.axes if ax.get_images()), np.nan)
    langs = grid_languages(result.observations)
    assert stock.shape == (len(langs), len(langs)) == (3, 3)
    for (i, lead), (j, later) in itertools.product(enumerate(langs), repeat=2):
        config = lead if lead == later else f"[{lead}, {later}, ..., {later}]"
        assert stock[i, j] == pytest.approx(result.ols(n=3, config=config).params[1], abs=1e-12), (lead, later)
    eff = pd.read_csv(tmp_path / "out" / "language_effects.csv")
    assert set(eff["language"]) == set(LANGS)
    assert set(eff["measure"]) == {"sigma", "margin"}
    md = (tmp_path / "out" / "tables" / "language_effects_n3.md").read_text()
    assert "mean tokens / segment" in md and "length-adj." in md
    assert "The margin subtracts" in (tmp_path / "out" / "tables" / "language_effects_margin_n3.md").read_text()


def _components(sets, topics) -> np.ndarray:
    """Connected components of the set-topic graph by breadth-first search (independent of posfair's union-find)."""
    edges: dict[str, set[str]] = {}
    for s, t in zip(sets, topics, strict=True):
        edges.setdefault(f"s:{s}", set()).add(f"t:{t}")
        edges.setdefault(f"t:{t}", set()).add(f"s:{s}")
    label: dict[str, int] = {}
    for start in sorted(edges):
        if start in label:
            continue
        label[start], queue = len(set(label.values())), [start]
        while queue:
            for nxt in edges[queue.pop()]:
                if nxt not in label:
                    label[nxt] = label[start]
                    queue.append(nxt)
    return np.array([label[f"s:{s}"] for s in sets])


def test_pooled_language_regression_default_is_the_wider_of_two_way_and_components(result):
    """Two 'families' (the grid and a copy with its own sets and topics, other noise): the sets form 2 components; per
    term the default takes the wider 95 % interval of statsmodels' two-way and component fits and names it."""
    obs = result.observations
    rng = np.random.default_rng(0)
    copy = obs.assign(set_id=obs["set_id"] + "#b", topic=obs["topic"] + "#b", doc_id=obs["doc_id"].astype(str) + "#b")
    copy["sigma"] = copy["sigma"] + rng.normal(0, 0.02, len(copy))
    both = pd.concat([obs.assign(doc_id=obs["doc_id"].astype(str)), copy], ignore_index=True)
    fit = fit_language_ols(both, n=3)  # the default
    assert fit.inference == "CR1 conservative t(G-1)"
    two, g = _direct_fit(both, "stock", False)
    comp = _components(g["set_id"], g["topic"])
    assert len(set(comp)) == 2
    by_comp = _direct_fit(both, "stock", False, clusters="set")[0].model.fit(
        cov_type="cluster", cov_kwds={"groups": comp}, use_t=True
    )
    G_two = min(g["set_id"].nunique(), g["topic"].nunique())
    names = {f"later:{lang}": f"C(lang, Treatment('en'))[T.{lang}]" for lang in ("de", "fr")}
    se_two = pd.Series(_psd_se(two), index=two.params.index)
    for k, name in enumerate(fit.names):
        if name not in names:
            continue
        i = names[name]
        widths = {"two": stats.t.ppf(0.975, G_two - 1) * se_two[i], "comp": stats.t.ppf(0.975, 1) * by_comp.bse[i]}
        use = "comp" if widths["comp"] >= widths["two"] else "two"
        se, G = (by_comp.bse[i], 2) if use == "comp" else (se_two[i], G_two)
        assert fit.bse[k] == pytest.approx(se, rel=1e-8) and fit.G[k] == G
        assert fit.pvalues[k] == pytest.approx(2 * stats.t.sf(abs(fit.params[k] / se), G - 1), rel=1e-6)
        assert fit.clusters_used[k].startswith("components (2 of" if use == "comp" else "set+topic (")
    frame = fit.to_frame()
    assert frame["cluster_by"].tolist() == list(fit.clusters_used) and frame["clusters"].tolist() == list(fit.G)


def test_monolingual_instances_only_leave_out_the_lead_dummies(result):
    obs = result.observations[result.observations["lead_lang"] == result.observations["later_lang"]]
    fit = fit_language_ols(obs, n=3, clusters="set+topic")
    assert not fit.lead_controls and not any(nm.startswith("lead:") for nm in fit.names)
    g = obs[(obs["calibration"] == "stock") & (obs["position"] >= 2)]
    groups = np.column_stack([pd.factorize(g["set_id"])[0], pd.factorize(g["topic"])[0]])  # set and topic
    direct = smf.ols("sigma ~ C(lang, Treatment('en')) + C(position)", data=g).fit(
        cov_type="cluster", cov_kwds={"groups": groups}, use_t=True
    )
    assert fit.params[fit.names.index("later:de")] == pytest.approx(
        direct.params["C(lang, Treatment('en'))[T.de]"], abs=1e-10
    )
    se = _psd_se(direct)[list(direct.params.index).index("C(lang, Treatment('en'))[T.fr]")]
    assert fit.bse[fit.names.index("later:fr")] == pytest.approx(se, rel=1e-8)


def test_the_language_captions_of_a_fresh_audit_read_no_label_back(result, monkeypatch):
    """The pooled language regression carries its inference typed: the language tables' captions put it in words
    without parsing the text column (which language_effects.csv keeps)."""
    from posfair.fairness.language_report import language_tables
    from posfair.stats.inference import InferenceLabel

    sentence = result.inference.used().sentence()

    def _refuse(cls, label):
        raise AssertionError(f"a fresh fit's label was parsed: {label!r}")

    monkeypatch.setattr(InferenceLabel, "parse", classmethod(_refuse))
    captions = [t.caption for t in language_tables(result)]
    assert sum(f"Inference: {sentence}" in c for c in captions) >= 1
    fit = fit_language_ols(result.observations, n=3)
    assert fit.inference_used == result.inference.used() and fit.inference == fit.inference_used.text()
