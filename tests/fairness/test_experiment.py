import base64
import logging
import re

import numpy as np
import pandas as pd
import pytest
import torch

from posfair import Calibration
from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.pipeline import PositionalFairnessEvaluator, audit

CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)
SETTINGS = AuditSettings(n_values=(2, 3), configs=("en", "de:en"), target_docs=12, min_segment_tokens=1,
                         max_segment_tokens=60, batch_size=8, chunk_size=8)  # fmt: skip
SMALL = AuditSettings(n_values=(3,), configs=("de:en",), target_docs=12, min_segment_tokens=1, max_segment_tokens=60,
                      batch_size=4, chunk_size=4)  # fmt: skip


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("bert-mean")


@pytest.fixture(scope="module")
def corpus(make_corpus):
    return make_corpus(topics=8)


@pytest.fixture(scope="module")
def result(model, corpus, tmp_path_factory):
    return audit(model, corpus, SETTINGS, [CAL], cache_dir=tmp_path_factory.mktemp("cache"))


def _cos(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_observation_bookkeeping(result):
    obs = result.observations
    # stock main + calibrated main + calibrated control, per instance n! * sets * n rows
    for (n, cfg), g in obs.groupby(["n", "config"]):
        docs = g[(g.calibration == "stock")]["doc_id"].nunique()
        assert docs % {2: 2, 3: 6}[n] == 0 and docs >= 12
        assert len(g) == 3 * docs * n
        assert sorted(g["position"].unique()) == list(range(1, n + 1))
        # within a set, each topic appears (n-1)! times at every position
        s = g[g.calibration == "stock"]
        counts = s.groupby(["set_id", "topic", "position"]).size()
        assert set(counts) == {1 if n == 2 else 2}
        assert len(counts) == s["set_id"].nunique() * n * n
        if cfg != "en":
            assert set(s[s.position == 1]["lang"]) == {"de"} and set(s[s.position > 1]["lang"]) == {"en"}
    assert set(obs["setting"]) == {"main", "control"}
    assert obs[obs.calibration == "stock"]["setting"].eq("main").all()
    for col in ("doc_id", "set_id", "permutation", "position", "segment_id", "lang", "calibration"):
        assert col in obs.columns


def test_sigma_tau_against_direct_computation(result, model):
    obs = result.observations
    stock = obs[(obs.calibration == "stock")]
    doc = stock[stock.n == 3].iloc[:3]  # the three positions of the first document
    assert doc["doc_id"].nunique() == 1
    texts = [text_of(sid) for sid in doc["segment_id"]]
    doc_text = " ".join(texts)
    with enc.max_seq_length(model, 512):
        e_doc = model.encode([doc_text], calibration=STOCK)[0]
        e_seg = model.encode(texts, calibration=STOCK)
    for i, row in enumerate(doc.itertuples()):
        assert row.sigma == pytest.approx(_cos(e_doc, e_seg[i]), abs=1e-5)
    # contextualised segments: mean of the final-layer states over the segment's tokens, computed directly
    tok = model.tokenizer
    ids = tok(doc_text, return_tensors="pt")
    with torch.no_grad():
        states = model[0].auto_model(**ids).last_hidden_state[0].numpy()
    start = 1  # after [CLS]
    for i, t in enumerate(texts):
        k = len(tok(t, add_special_tokens=False)["input_ids"])
        ctx = states[start : start + k].mean(axis=0)
        start += k
        assert doc.iloc[i]["tau"] == pytest.approx(_cos(e_seg[i], ctx), abs=1e-5)
        assert doc.iloc[i]["seg_tokens"] == k


_TEXTS: dict = {}


def text_of(segment_id):
    return _TEXTS[segment_id]


@pytest.fixture(autouse=True, scope="module")
def _texts(corpus):
    for r in corpus.itertuples():
        _TEXTS[f"{r.lang}:{r.id}"] = r.text.strip()


def test_control_uses_stock_segments(result, model):
    obs = result.observations
    label = CAL.label()
    main = obs[(obs.calibration == label) & (obs.setting == "main") & (obs.n == 2)].iloc[:2]
    ctrl = obs[(obs.calibration == label) & (obs.setting == "control") & (obs.n == 2)].iloc[:2]
    assert main["doc_id"].tolist() == ctrl["doc_id"].tolist()
    texts = [text_of(s) for s in main["segment_id"]]
    with enc.max_seq_length(model, 512):
        e_doc = model.encode([" ".join(texts)], calibration=CAL)[0]
        seg_cal = model.encode(texts, calibration=CAL)
        seg_stock = model.encode(texts, calibration=STOCK)
    for i in range(2):
        assert main.iloc[i]["sigma"] == pytest.approx(_cos(e_doc, seg_cal[i]), abs=1e-5)
        assert ctrl.iloc[i]["sigma"] == pytest.approx(_cos(e_doc, seg_stock[i]), abs=1e-5)
    # the calibration is active on these documents
    assert not np.allclose(seg_cal, seg_stock, atol=1e-4)


def test_cache_reuse_computes_nothing(result, model, corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = audit(model, corpus, SMALL, [CAL], cache_dir=cache)

    def boom(*a, **k):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(enc, "encode_texts", boom)
    monkeypatch.setattr(enc, "encode_documents", boom)
    again = audit(model, corpus, SMALL, [CAL], cache_dir=cache)
    pd.testing.assert_frame_equal(first.observations, again.observations)
    pd.testing.assert_frame_equal(first.coefficients, again.coefficients)


def test_resume_after_kill_gives_identical_results(model, corpus, tmp_path, monkeypatch):
    reference = audit(model, corpus, SMALL, [CAL], cache_dir=tmp_path / "ref")
    real = enc.encode_documents
    calls = {"n": 0}

    def dies_after_three(*a, **k):  # 3 stock document chunks, then die inside the calibrated pass
        calls["n"] += 1
        if calls["n"] > 4:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(enc, "encode_documents", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        audit(model, corpus, SMALL, [CAL], cache_dir=tmp_path / "run")
    assert calls["n"] == 5
    monkeypatch.setattr(enc, "encode_documents", real)
    resumed = audit(model, corpus, SMALL, [CAL], cache_dir=tmp_path / "run")
    pd.testing.assert_frame_equal(reference.observations, resumed.observations, check_exact=True)
    pd.testing.assert_frame_equal(reference.coefficients, resumed.coefficients, check_exact=True)


def test_coefficients_match_observations(result):
    obs, coefs = result.observations, result.coefficients
    g = obs[(obs.calibration == "stock") & (obs.n == 3) & (obs.config == "en")]
    b2 = result.coefficient(n=3, config="en", position=2)
    assert b2["estimate"] == pytest.approx(
        g[g.position == 2]["sigma"].mean() - g[g.position == 1]["sigma"].mean(), abs=1e-12
    )
    assert b2["clusters"] == g["set_id"].nunique()
    assert set(coefs["measure"]) == {"sigma", "tau"}
    # default inference: CR1 + t(G-1), as statsmodels computes it from the same observations
    import statsmodels.api as sm

    X = np.column_stack([np.ones(len(g))] + [(g["position"] == p).to_numpy(float) for p in (2, 3)])
    ref = sm.OLS(g["sigma"].to_numpy(), X).fit(
        cov_type="cluster", cov_kwds={"groups": g["set_id"].astype("category").cat.codes}, use_t=True
    )
    assert b2["se"] == pytest.approx(ref.bse[1], rel=1e-10) and b2["p"] == pytest.approx(ref.pvalues[1], rel=1e-8)
    # the default, conservative: no topic in two sets here, so the sets (and it says so)
    assert b2["inference"] == "CR1 conservative t(G-1)" and b2["cluster_by"].startswith("sets (")
    assert result.settings["inference"] == "cluster" and result.settings["bootstrap_weights"] == "webb"
    t = result.tables()[0]
    assert list(t.frame.columns) == ["en", "[de, en, ..., en]"]
    assert t.frame.index.tolist()[0] == (2, "β0 (intercept)")
    assert t.frame.loc[(3, "G (clusters)"), "en"] == str(g["set_id"].nunique())


def test_save_writes_everything(result, tmp_path):
    paths = result.save(tmp_path / "out")
    obs = pd.read_parquet(paths["observations"])
    pd.testing.assert_frame_equal(obs, result.observations, check_dtype=False)
    html = paths["report"].read_text()
    assert "data:image/png;base64," in html and "OLS coefficients" in html and result.model["fingerprint"] in html
    pngs = {}
    for stem in ("profiles_main", "profiles_control"):  # what each draws: report/test_audit_output.py
        pngs[stem] = (tmp_path / "out" / "figures" / f"{stem}.png").read_bytes()
        assert "data:image/png;base64," + base64.b64encode(pngs[stem]).decode() in html  # the figure the report shows
        assert (tmp_path / "out" / "figures" / f"{stem}.pdf").read_bytes()[:4] == b"%PDF"
    assert pngs["profiles_main"] != pngs["profiles_control"]
    assert (tmp_path / "out" / "tables" / "sigma_stock_main.tex").read_text().startswith("\\begin{table}")
    detail = pd.read_csv(tmp_path / "out" / "tables" / "sigma_stock_main_detail.csv")
    assert list(detail.columns) == [
        "n",
        "configuration",
        "coefficient",
        "estimate",
        "SE",
        "t",
        "p",
        "mark",
        "G",
        "clusters",
        "inference",
    ]
    assert "Few clusters:" in html  # the tiny audit rests on a handful of segment sets
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_evaluator_returns_headline_dict(model, corpus):
    ev = PositionalFairnessEvaluator(corpus, SMALL, name="pf")
    metrics = ev(model)
    assert ev.primary_metric == "pf_stock_main_sigma_mean_later_beta"
    assert ev.primary_metric in metrics
    coefs = ev.last_result.coefficients
    later = coefs[(coefs.measure == "sigma") & (coefs.position > 1)]
    assert metrics[ev.primary_metric] == pytest.approx(later["estimate"].mean())
    assert metrics["pf_stock_main_sigma_n3_de-en_beta_2"] == pytest.approx(
        ev.last_result.coefficient(n=3, config="[de, en, ..., en]", position=2)["estimate"]
    )


def test_settings_errors(model, corpus):
    with pytest.raises(ValueError, match=">= 2"):
        AuditSettings(n_values=(1, 3))
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        audit(model, corpus, AuditSettings(n_values=(2,), configs=("xx",), target_docs=4))
    with pytest.raises(ValueError, match="at least 2"):
        audit(
            model,
            corpus,
            AuditSettings(n_values=(3,), configs=("en",), target_docs=6, min_segment_tokens=1, max_segment_tokens=60),
        )
    with pytest.raises(ValueError, match="position limit"):
        audit(model, corpus, AuditSettings(n_values=(2,), max_seq_length=4096))


def test_ols_keeps_statsmodels_results(result):
    """The regression behind a block of coefficients, with statsmodels' results object: same numbers as the table."""
    coefs = result.coefficients
    for measure, cal, setting in (
        ("sigma", "stock", "main"),
        ("tau", CAL.label(), "main"),
        ("sigma", CAL.label(), "control"),
    ):
        fit = result.ols(measure=measure, calibration=cal, setting=setting, n=3, config="[de, en, ..., en]")
        rows = coefs[
            (coefs.measure == measure) & (coefs.calibration == cal) & (coefs.setting == setting) & (coefs.n == 3)
        ]
        rows = rows[rows.config == "[de, en, ..., en]"].sort_values("position")
        np.testing.assert_array_equal(fit.params, rows["estimate"].to_numpy())
        np.testing.assert_array_equal(fit.pvalues, rows["p"].to_numpy())
        ci = fit.result.conf_int()
        np.testing.assert_array_equal(ci, rows[["ci_low", "ci_high"]].to_numpy())
        np.testing.assert_array_equal(fit.conf_int(), ci)
        assert (rows["ci_low"] <= rows["estimate"]).all() and (rows["estimate"] <= rows["ci_high"]).all()
    text = fit.summary().as_text()
    assert "beta_0" in text and "beta_3" in text and "cluster" in text
    assert "coef" in fit.result.summary().as_text()
    with pytest.raises(KeyError, match="no observations"):
        result.ols(n=7, config="en")


def _cached_counts(message: str) -> tuple[int, ...]:
    m = re.search(r"(\d+) segments \((\d+) cached\), (\d+) documents \((\d+) cached\)", message)
    return tuple(int(x) for x in m.groups())


@pytest.mark.filterwarnings("ignore::posfair.stats.inference.FewClustersWarning")
def test_progress_callback_bars_and_logging(model, corpus, tmp_path, capsys, caplog):
    """audit() reports progress through a callback or tqdm (never rich) and logs what it encodes and what was cached."""
    calls = []

    def progress(desc, total, done):
        calls.append([desc, total, done])
        return lambda k: calls[-1].append(k)

    with caplog.at_level(logging.INFO, logger="posfair.fairness"):
        audit(model, corpus, SMALL, cache_dir=tmp_path, progress=progress)
    (desc, total, done, *ticks) = calls[0]
    assert len(calls) == 1 and desc.startswith("n=3 ") and done == 0 and sum(ticks) == total  # the instance by its name
    first = [_cached_counts(r.getMessage()) for r in caplog.records if "cached" in r.getMessage()]
    assert len(first) == 1 and first[0][0] > 0 and first[0][2] > 0 and first[0][1] == first[0][3] == 0
    caplog.clear()
    capsys.readouterr()
    with caplog.at_level(
        logging.INFO, logger="posfair.fairness"
    ):  # INFO: bars shown by default, as in sentence-transformers
        audit(model, corpus, SMALL, cache_dir=tmp_path)
    again = [_cached_counts(r.getMessage()) for r in caplog.records if "cached" in r.getMessage()]
    assert again == [(first[0][0], first[0][0], first[0][2], first[0][2])]  # everything came from the cache
    assert "100%" in capsys.readouterr().err
    audit(model, corpus, SMALL, cache_dir=tmp_path, show_progress_bar=False)
    assert capsys.readouterr().err == ""
