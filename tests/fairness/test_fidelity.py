"""The fidelity measures (margin, own-segment recall@n, drift) against direct NumPy computations."""

import base64

import numpy as np
import pandas as pd
import pytest

from fairness.conftest import assert_matches_by_hand
from posfair import Calibration
from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.measures import fidelity_measures, profile_spread
from posfair.fairness.pipeline import audit

CAL = Calibration(basket_size=4, layers=1.0, strength=1.0)
SETTINGS = AuditSettings(n_values=(3,), configs=("de:en",), target_docs=18, min_segment_tokens=1, max_segment_tokens=60,
                         batch_size=8, chunk_size=8)  # fmt: skip


@pytest.fixture(scope="module")
def run(tiny_model, make_corpus, tmp_path_factory):
    """(model, corpus, audit result): a mixed de:en instance of 3 segment sets, stock + one calibration."""
    model, corpus = tiny_model("bert-mean"), make_corpus(topics=9)
    return model, corpus, audit(model, corpus, SETTINGS, [CAL], cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model(run):
    return run[0]


@pytest.fixture(scope="module")
def corpus(run):
    return run[1]


@pytest.fixture(scope="module")
def result(run):
    return run[2]


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_fidelity_measures_on_hand_made_vectors():
    # pool: 0,1 = own segments of document 0 (set A); 2 = other-language version in set A; 3,4 = set B
    pool = np.array([[1, 0, 0], [0.8, 0.6, 0], [1, 0.01, 0], [0, 1, 0], [0.6, 0.8, 0]], dtype=np.float64)
    docs = np.array([[0.6, 0.8, 0], [0, 1, 0.1]], dtype=np.float64)
    own = np.array([[0, 1], [3, 4]])
    own_set = [np.array([0, 1, 2]), np.array([3, 4])]
    stock = np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float64)
    out = fidelity_measures(docs, pool, own, own_set, stock)
    cos = _unit(docs) @ _unit(pool).T
    assert out["other_cos"][0] == pytest.approx(cos[0, [3, 4]].mean())
    assert out["other_cos"][1] == pytest.approx(cos[1, [0, 1, 2]].mean())
    # doc 0: candidates 0, 1 (own), 3, 4 (other); segment 2 (same set, not its own) is no candidate
    top0 = [c for c in np.argsort(-cos[0]) if c != 2][:2]
    assert out["recall"][0] == pytest.approx(np.isin(top0, [0, 1]).mean())
    top1 = np.argsort(-cos[1])[:2]
    assert out["recall"][1] == pytest.approx(np.isin(top1, [3, 4]).mean())
    assert out["recall"].tolist() == [0.5, 1.0]  # document 0: set B's segment 4 outranks its own segment 0
    assert out["drift"] == pytest.approx(np.sum(_unit(docs) * _unit(stock), axis=1))
    assert np.array_equal(fidelity_measures(docs, pool, own, own_set)["drift"], [1.0, 1.0])
    with pytest.raises(ValueError, match="own set"):
        fidelity_measures(docs, pool, own, [np.array([0]), np.array([3, 4])])


def test_profile_spread():
    assert profile_spread(np.array([0.6, 0.5, 0.4, 0.8, 0.5, 0.2]), np.array([1, 2, 3, 1, 2, 3])) == pytest.approx(
        0.7 - 0.3
    )


def _direct(model, docs: pd.DataFrame, texts: dict, calibration):
    """Per document: (other_cos, recall, drift) from fresh encodings of its text and of every pool segment."""
    pool_ids = sorted(texts)
    with enc.max_seq_length(model, 512):
        kw = {"calibration": calibration}
        pool = model.encode([texts[s] for s in pool_ids], **kw)
        doc_ids = list(dict.fromkeys(docs["doc_id"]))
        by_doc = {d: g.sort_values("position") for d, g in docs.groupby("doc_id")}
        doc_text = [" ".join(texts[s] for s in by_doc[d]["segment_id"]) for d in doc_ids]
        e_doc = model.encode(doc_text, **kw)
        e_stock = model.encode(doc_text, calibration=STOCK)
    topics_of_set = docs.groupby("set_id")["topic"].agg(set).to_dict()
    out = {}
    for i, d in enumerate(doc_ids):
        g = by_doc[d]
        cos = np.array([float(_unit(e_doc[i]) @ _unit(p)) for p in pool])
        set_topics = topics_of_set[g["set_id"].iloc[0]]
        other = np.array([s.split(":", 1)[1] not in set_topics for s in pool_ids])
        own = np.array([s in set(g["segment_id"]) for s in pool_ids])
        cand = np.flatnonzero(own | other)
        top = cand[np.argsort(-cos[cand], kind="stable")[:3]]
        out[d] = (cos[other].mean(), own[top].mean(), float(_unit(e_doc[i]) @ _unit(e_stock[i])), g)
    return out


@pytest.mark.parametrize("variant", ["stock", "calibrated"])
def test_measures_match_direct_computation(result, model, corpus, variant):
    obs = result.observations
    label = "stock" if variant == "stock" else CAL.label()
    rows = obs[(obs.calibration == label) & (obs.setting == "main")]
    texts = {f"{r.lang}:{r.id}": r.text.strip() for r in corpus.itertuples()}
    texts = {s: texts[s] for s in rows["segment_id"].unique()}  # the instance's pool
    direct = _direct(model, rows, texts, CAL if variant == "calibrated" else STOCK)
    assert len(direct) == rows["doc_id"].nunique() >= 12
    for other_cos, recall, drift, g in direct.values():
        assert g["other_cos"].to_numpy() == pytest.approx(np.full(3, other_cos), abs=1e-5)
        assert g["margin"].to_numpy() == pytest.approx(g["sigma"].to_numpy() - other_cos, abs=1e-5)
        assert g["recall"].iloc[0] == pytest.approx(recall)
        assert g["drift"].iloc[0] == pytest.approx(1.0 if variant == "stock" else drift, abs=1e-6)
    if variant == "calibrated":
        assert rows["drift"].min() < 1 - 1e-7  # the calibration moves the documents (a little, in a random tiny model)


def test_control_rows_use_stock_segments(result, model, corpus):
    obs = result.observations
    ctrl = obs[(obs.calibration == CAL.label()) & (obs.setting == "control")]
    main = obs[(obs.calibration == CAL.label()) & (obs.setting == "main")]
    texts = {f"{r.lang}:{r.id}": r.text.strip() for r in corpus.itertuples()}
    texts = {s: texts[s] for s in ctrl["segment_id"].unique()}
    d = ctrl["doc_id"].iloc[0]
    g = ctrl[ctrl.doc_id == d].sort_values("position")
    with enc.max_seq_length(model, 512):
        e_doc = model.encode([" ".join(texts[s] for s in g["segment_id"])], calibration=CAL)[0]
        set_topics = set(obs[obs.set_id == g["set_id"].iloc[0]]["topic"])
        other = [s for s in sorted(texts) if s.split(":", 1)[1] not in set_topics]
        e_other = model.encode([texts[s] for s in other], calibration=STOCK)
    assert g["other_cos"].iloc[0] == pytest.approx(float(np.mean(_unit(e_other) @ _unit(e_doc))), abs=1e-5)
    assert np.allclose(ctrl["drift"].to_numpy(), main["drift"].to_numpy())


def test_summary_tables_figure_and_report(result, tmp_path):
    fid = result.fidelity()
    obs = result.observations
    for r in fid.itertuples(index=False):
        g = obs[(obs.calibration == r.calibration) & (obs.setting == r.setting)]
        means = g.groupby("position")["sigma"].mean()
        assert r.spread == pytest.approx(means.max() - means.min())
        assert r.max_abs_beta == pytest.approx((means.iloc[1:] - means.iloc[0]).abs().max())
        assert r.recall == pytest.approx(g.drop_duplicates("doc_id")["recall"].mean())
        assert r.margin_p2 == pytest.approx(g[g.position == 2]["margin"].mean())
    head = result.headline()
    stock = fid[fid.calibration == "stock"].iloc[0]
    assert head["stock_main_recall_n3_de-en"] == pytest.approx(stock["recall"])
    assert head[f"{CAL.label()}_main_drift_mean"] == pytest.approx(
        fid[(fid.calibration == CAL.label()) & (fid.setting == "main")]["drift"].iloc[0]
    )
    paths = result.save(tmp_path / "out")
    assert (tmp_path / "out" / "figures" / "fidelity.png").is_file()  # what it draws: report/test_audit_output.py
    assert (tmp_path / "out" / "figures" / "fidelity.pdf").exists()
    md = (tmp_path / "out" / "tables" / "fidelity.md").read_text()
    assert "recall@n" in md and f"{stock['recall']:.3f}" in md and "(control)" in md
    html = paths["report"].read_text()
    assert "Fidelity" in html and "own-segment recall" in html
    png = (tmp_path / "out" / "figures" / "fidelity.png").read_bytes()
    assert "data:image/png;base64," + base64.b64encode(png).decode() in html  # the trade-off figure the report shows
    saved = pd.read_parquet(paths["observations"])
    assert {"margin", "recall", "drift", "other_cos"} <= set(saved.columns)
    # the file's every number as computed by hand from the observations (not by the fidelity() that wrote it)
    written = pd.read_csv(paths["fidelity"])
    assert_matches_by_hand(written, obs)
    share = written.groupby("calibration")["calibrated_share"]
    assert share.apply(lambda s: s.isna().all())["stock"] and share.min()[CAL.label()] > 0


def test_the_audit_figures_are_laid_out_and_say_what_they_show(result):
    """Drawn at their real size: no text off the canvas, no labels on each other; the subtitle names the model,
    the token limit and every calibration in words."""
    from posfair.calibration import Calibration
    from posfair.fairness.audit_report import fidelity_figure, profile_figure
    from posfair.report.plots import figure_heading, layout_problems

    for fig in (profile_figure(result), fidelity_figure(result)):
        assert layout_problems(fig) == []
        heading = figure_heading(fig)  # title, subtitle and the note under the legend; a long path breaks after a /
        assert result.model["name"] in heading and f"token limit {result.model['limit']}" in heading
        for c in result.calibrations:
            words = Calibration.from_dict({k: v for k, v in c.items() if k not in ("label", "key")}).describe()
            assert " ".join(words.split()) in heading
    from posfair.report.html import render_report

    html = render_report("t", result.report_sections())  # the report says each calibration in words too
    for c in result.calibrations:
        words = Calibration.from_dict({k: v for k, v in c.items() if k not in ("label", "key")}).describe()
        assert html.count(words) >= 2  # the summary and the run parameters
