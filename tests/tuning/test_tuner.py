"""The tuner: known optimum of a synthetic objective, constraint, Pareto front, split, resume, saved model."""

import dataclasses
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import posfair
from posfair import Calibration
from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.retrieval.metrics import harmonic_mean
from posfair.runtime.errors import PosfairInputError
from posfair.tuning import (
    DEV,
    TEST,
    CalibrationTuner,
    FairnessObjective,
    FunctionObjective,
    RetrievalObjective,
    SearchSpace,
    Trial,
    default_fairness_settings,
    pareto_front,
    run_search,
    save_tuned_model,
    split_ids,
    tune,
)
from posfair.tuning.tuner import build_corpus_benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402

SPACE = SearchSpace(
    basket_sizes=(16, 64, 256), layer_sets=(1, 0.5), strengths=(0.5, 1.0), fine_rounds=6, min_step=0.005
)


def synthetic(cal, split, *, optimum=0.7, slope=0.05):
    """Score (lower is better) with its minimum at basket 64, layers 0.5, strength ``optimum``; guard falls with strength."""
    if cal is STOCK:
        return {"score": 1.0, "guard": 1.0}
    s = (cal.strength - optimum) ** 2 + (0 if cal.basket_size == 64 else 0.1) + (0 if cal.layers == 0.5 else 0.05)
    return {"score": s, "guard": 1.0 - slope * cal.strength}


def test_finds_the_known_optimum():
    res = run_search(FunctionObjective(synthetic), SPACE, max_drop=0.1)
    c = res.chosen
    assert (c.basket_size, c.layers) == (64, 0.5)
    assert abs(c.strength - 0.7) < 0.02
    dev = res.dev_trials()
    assert len(dev) == 1 + len(SPACE.coarse()) + len([t for t in dev if t.phase == "fine"])
    assert all((t.line.basket_size, t.line.layers) == (64, 0.5) for t in dev if t.phase == "fine")
    assert res.trial(c, DEV).metrics["score"] == min(t.metrics["score"] for t in dev)


def test_constraint_limits_the_choice():
    # guard = 1 - 0.2 * strength, at most 0.1 below stock (1.0): strength <= 0.5 is feasible
    res = run_search(FunctionObjective(lambda c, s: synthetic(c, s, slope=0.2)), SPACE, max_drop=0.1)
    assert res.chosen.strength == pytest.approx(0.5)
    assert (res.chosen.basket_size, res.chosen.layers) == (64, 0.5)
    f = res.frame(DEV)
    assert not f[f.strength > 0.5 + 1e-9]["feasible"].any() and f[f.strength <= 0.5]["feasible"].all()
    # nothing feasible at all: stock is kept
    res = run_search(
        FunctionObjective(lambda c, s: synthetic(c, s, slope=0.2)),
        SearchSpace(strengths=(0.8, 1.0), fine_rounds=0),
        max_drop=0.1,
    )
    assert res.chosen is STOCK and not res.feasible


def test_pareto_front_against_brute_force():
    rng = np.random.default_rng(3)
    s = rng.random(40)
    g = s + 0.2 * rng.random(40)  # a trade-off: a better (lower) score comes with a worse guard
    trials = [
        Trial(Calibration(basket_size=8 * (i + 1)), DEV, "coarse", {"s": float(a), "g": float(b)})
        for i, (a, b) in enumerate(zip(s, g, strict=True))
    ]
    front = pareto_front(trials, "s", "g", greater_is_better=False)
    expect = {
        t.key
        for t in trials
        if not any(o.metrics["s"] <= t.metrics["s"] and o.metrics["g"] >= t.metrics["g"] and o is not t for o in trials)
    }
    assert {t.key for t in front} == expect and len(expect) >= 4
    assert [t.metrics["g"] for t in front] == sorted((t.metrics["g"] for t in front), reverse=True)


def test_test_split_never_influences_the_choice():
    calls = []

    def poisoned(value):
        def fn(cal, split):
            calls.append((split, cal.key()))
            if split == TEST:  # anything on the test split: here an optimum somewhere else entirely
                return {"score": value * (1 - (0 if cal is STOCK else cal.strength)), "guard": value}
            return synthetic(cal, split)

        return FunctionObjective(fn)

    a = run_search(poisoned(-1e6), SPACE, max_drop=0.1)
    n_a = len(calls)
    b = run_search(poisoned(1e6), SPACE, max_drop=0.1)
    assert a.chosen == b.chosen
    assert [(t.key, t.metrics) for t in a.dev_trials()] == [(t.key, t.metrics) for t in b.dev_trials()]
    first = calls[:n_a]
    test_calls = [c for c in first if c[0] == TEST]
    assert first[-len(test_calls) :] == test_calls  # the test split comes last ...
    assert sorted(k for _, k in test_calls) == sorted(["stock", a.chosen.key()])  # ... for stock and the choice only
    assert a.test_metrics()["chosen"]["guard"] == -1e6 and b.test_metrics()["chosen"]["guard"] == 1e6


def test_resume_reads_finished_trials(tmp_path):
    path = tmp_path / "tune.json"
    first = run_search(FunctionObjective(synthetic, identity="v1"), SPACE, max_drop=0.1, results_path=path)
    saved = json.loads(path.read_text())
    assert len(saved["trials"]) == len(first.trials) and saved["chosen_label"] == first.chosen.label()

    def boom(cal, split):
        raise AssertionError("finished trials must be read back")

    again = run_search(FunctionObjective(boom, identity="v1"), SPACE, max_drop=0.1, results_path=path)
    assert again.chosen == first.chosen and [t.metrics for t in again.trials] == [t.metrics for t in first.trials]
    # killed after 4 trials: the re-run computes only the rest
    saved["trials"] = saved["trials"][:4]
    path.write_text(json.dumps(saved))
    seen = []
    resumed = run_search(
        FunctionObjective(lambda c, s: seen.append(1) or synthetic(c, s), identity="v1"),
        SPACE,
        max_drop=0.1,
        results_path=path,
    )
    assert len(seen) == len(first.trials) - 4 and resumed.chosen == first.chosen
    with pytest.raises(ValueError, match="different objective"):
        run_search(FunctionObjective(synthetic, identity="v2"), SPACE, results_path=path)


def test_split_ids_and_space_validation():
    dev, test = split_ids([f"s{i}" for i in range(10)], 0.3, seed=1)
    assert len(test) == 3 and len(dev) == 7 and not set(dev) & set(test)
    assert split_ids([f"s{i}" for i in range(10)], 0.3, seed=1) == (dev, test)
    assert len(SearchSpace(layer_sets=(1, 1.0)).layer_sets) == 2  # last layer and all layers are different sets
    assert SearchSpace(strengths=(0.0, 1.0)).strengths == (1.0,)  # 0 is the stock model, evaluated anyway
    with pytest.raises(ValueError, match="strength"):
        SearchSpace(strengths=(0.0,))
    with pytest.raises(ValueError, match="strength"):
        SearchSpace(strengths=(1.5,))


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("bert-mean")


SETTINGS = default_fairness_settings(
    target_docs=24, min_segment_tokens=1, max_segment_tokens=60, batch_size=8, chunk_size=8
)
SMALL = SearchSpace(basket_sizes=(4,), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=1)


def test_real_run_on_a_tiny_model(model, tmp_path, monkeypatch):
    corpus = tiny_corpus(topics=12)
    encoded: list[str] = []
    real = enc.encode_documents

    def spy(m, texts, *a, **k):
        encoded.extend(texts)
        return real(m, texts, *a, **k)

    monkeypatch.setattr(enc, "encode_documents", spy)
    obj = FairnessObjective(model, corpus, SETTINGS, store=tmp_path / "cache")
    dev_sets, test_sets = set(obj.split_sets(DEV)), set(obj.split_sets(TEST))
    assert len(dev_sets) == len(test_sets) == 2 and not dev_sets & test_sets
    # held out by topic: no topic (in any language) is in a dev document and a test document
    topics = {
        split: {t for inst in obj.instances[split] for d in inst.documents for t in d.topics} for split in (DEV, TEST)
    }
    assert topics[DEV] and topics[TEST] and not topics[DEV] & topics[TEST]
    assert topics[DEV] <= set(obj.topics[DEV]) and topics[TEST] <= set(obj.topics[TEST])
    assert sorted(obj.topics[DEV] + obj.topics[TEST]) == sorted(corpus["id"].unique())
    test_docs = {d.text for inst in obj.instances[TEST] for d in inst.documents}
    order = []
    evaluate = obj.evaluate
    obj.evaluate = lambda cal, split: order.append((split, len(encoded))) or evaluate(cal, split)
    res = tune(
        model, objective=obj, space=SMALL, max_drop=0.05, out_dir=tmp_path / "out", save_model=tmp_path / "saved"
    )
    assert res.chosen is not STOCK or res.test_effect is None  # nothing to measure when stock is kept
    first_test = next(n for split, n in order if split == TEST)
    assert not test_docs & set(encoded[:first_test])  # no test document was even encoded before the choice
    assert test_docs <= set(encoded)
    # the metrics are those of an audit of the split
    stock = res.trial(STOCK, DEV).metrics
    obs = obj.observations([], DEV)
    means = obs.groupby("position")["sigma"].mean()
    assert stock["spread"] == pytest.approx(means.max() - means.min())
    assert stock["recall"] == pytest.approx(obs.drop_duplicates("doc_id")["recall"].mean())
    assert stock["documents"] == 12
    out = tmp_path / "out"
    for f in (
        "tune.json",
        "summary.md",
        "trials.csv",
        "tradeoff.png",
        "tables/pareto.md",
        "tables/test.tex",
        "test_audit/report.html",
    ):
        assert (out / f).exists(), f
    assert "Pareto front" in (out / "summary.md").read_text()
    trials = pd.read_csv(out / "trials.csv")
    assert set(trials[trials.split == TEST]["label"]) == {"stock", res.chosen_label}
    reloaded = posfair.load_model(tmp_path / "saved")
    assert reloaded.calibration == res.chosen


def test_saved_tuned_model_reloads_with_its_calibration(model, tmp_path):
    cal = Calibration(basket_size=4, layers=1.0, strength=0.75)
    path = save_tuned_model(model, cal, tmp_path / "tuned")
    assert model.calibration is STOCK  # the session model's own default is untouched
    reloaded = posfair.load_model(path)
    assert reloaded.calibration == cal
    texts = ["Apple river mountain code kernel package network music theory garden history science engine window."]
    np.testing.assert_allclose(reloaded.encode(texts), model.encode(texts, calibration=cal), atol=1e-6)
    stock = model.encode(texts, calibration=STOCK)
    assert not np.allclose(reloaded.encode(texts), stock, atol=1e-7)


def test_retrieval_objective_splits_queries_by_document(model, tiny_model_path, tmp_path):
    from typer.testing import CliRunner

    from posfair.cli import app

    bench = build_corpus_benchmark(model, tiny_corpus(topics=24), tmp_path / "bench")
    obj = RetrievalObjective(model, bench, store=tmp_path / "cache")
    dev, test = obj.splits[DEV], obj.splits[TEST]
    assert len(dev.query_ids) + len(test.query_ids) == len(bench.query_ids)
    assert not {int(r[0]) for r in dev.relevant} & {
        int(r[0]) for r in test.relevant
    }  # a document's queries stay together
    m = obj.evaluate(STOCK, DEV)
    direct = PositionalRetrievalEvaluator(dev, STOCK).evaluate(model)
    assert m["ndcg@10"] == pytest.approx(float(direct.ndcg.mean()))
    assert m["harm"] == pytest.approx(harmonic_mean(direct.groups))
    assert m["queries"] == len(dev.query_ids)
    # the command line end to end (retrieval objective on the saved benchmark; --baskets / --layer-sets / --strengths
    # override the grid's values: one setting, layers 1.0 = all layers, not 1 = the last one)
    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "cli"
    r = CliRunner().invoke(app, ["tune", "--model", str(path), "--objective", "retrieval", "--benchmark", str(tmp_path / "bench"), "--baskets", "4",
                                 "--layer-sets", "1.0", "--strengths", "1.0", "--fine-rounds", "0", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    saved = json.loads((out / "tune.json").read_text())
    assert saved["objective"]["score"] == "harm" and {t["split"] for t in saved["trials"]} == {DEV, TEST}
    tried = {json.dumps(t["calibration"], sort_keys=True) for t in saved["trials"] if t["calibration"] is not None}
    assert tried == {json.dumps(Calibration(basket_size=4, layers=1.0, strength=1.0).to_dict(), sort_keys=True)}
    # the terminal gets a few plain lines; the tables are in summary.md
    assert "chosen on the dev split: " in r.output and "Pareto front" not in r.output
    assert "Pareto front" in (out / "summary.md").read_text()


def test_evaluator_style_call(tmp_path):
    tuner = CalibrationTuner(objective=FunctionObjective(synthetic), space=SPACE, max_drop=0.1, name="tn")
    metrics = tuner(object(), output_path=str(tmp_path))
    assert tuner.primary_metric == "tn_test_chosen_score" and tuner.primary_metric in metrics
    chosen = tuner.last_result.chosen
    assert metrics["tn_chosen_strength"] == pytest.approx(chosen.strength) and abs(chosen.strength - 0.7) < 0.02
    assert metrics["tn_test_chosen_score"] == pytest.approx(synthetic(chosen, TEST)["score"])
    # the Pareto table lists the dev trials no other dev trial beats on both (lower score, higher guard), by brute force
    dev = tuner.last_result.dev_trials()
    front = {t.label for t in dev if not any(
        o.metrics["score"] <= t.metrics["score"] and o.metrics["guard"] >= t.metrics["guard"]
        and (o.metrics["score"], o.metrics["guard"]) != (t.metrics["score"], t.metrics["guard"]) for o in dev)}  # fmt: skip
    table = pd.read_csv(tmp_path / "tn" / "tables" / "pareto.csv")
    assert len(front) > 1 and set(table["setting"]) == front and len(table) == len(front)


def test_search_logs_and_shows_progress(caplog, capsys):
    lines = []
    with caplog.at_level(logging.INFO, logger="posfair.tuning.trials"):
        res = run_search(FunctionObjective(synthetic), SearchSpace(fine_rounds=1), max_drop=0.1, log=lines.append)
    logged = [r.getMessage() for r in caplog.records if r.name == "posfair.tuning.trials"]
    assert (
        logged == lines
        and lines[-2].startswith("test test")
        and lines[-1].startswith("on the held-out test split ")
        and any(m.startswith("chosen: ") for m in lines)
    )
    assert "tuning trials" in capsys.readouterr().err  # None: shown at INFO, like sentence-transformers
    run_search(FunctionObjective(synthetic), SearchSpace(fine_rounds=0), max_drop=0.1, show_progress_bar=False)
    assert "tuning trials" not in capsys.readouterr().err
    assert res.chosen is not STOCK


def test_a_held_out_document_family_is_the_whole_test_split(model, tmp_path):
    """--test-family: every test document is built from that family's topics only, every dev document from the
    others'; the split is recorded; a family the corpus lacks is refused with its families named."""
    from posfair.tuning.objectives import corpus_families, split_topics

    corpus = tiny_corpus(topics=24)
    corpus["source"] = ["faq" if int(i[-2:]) < 10 else "guide" for i in corpus["id"]]
    assert corpus_families(corpus) == ["faq", "guide"]
    topics = split_topics(corpus, 0.5, 0, test_family="faq")
    assert topics[TEST] == [f"topic{t:02d}" for t in range(10)] and topics[DEV] == [
        f"topic{t:02d}" for t in range(10, 24)
    ]
    obj = FairnessObjective(model, corpus, SETTINGS, store=tmp_path / "cache", test_family="faq")
    family = dict(zip(corpus["id"], corpus["source"], strict=True))
    for split, want in ((DEV, {"guide"}), (TEST, {"faq"})):
        used = {family[t] for inst in obj.instances[split] for d in inst.documents for t in d.topics}
        assert used == want, (split, used)
    assert obj.test_fraction == pytest.approx(10 / 24)  # the documents shared by the families' topic counts
    assert obj.describe()["split_by"] == "family" and obj.describe()["test_family"] == "faq"
    with pytest.raises(PosfairInputError, match="test family 'manual' is not in the corpus; its families: faq, guide"):
        split_topics(corpus, 0.5, 0, test_family="manual")
    with pytest.raises(PosfairInputError, match="has 0 document families"):
        split_topics(corpus.drop(columns="source"), 0.5, 0, test_family="faq")


def test_the_evaluator_style_tuner_holds_out_a_family(model, tmp_path):
    """CalibrationTuner(test_family=...) passes the family to the search (recorded in its result); a family the
    corpus lacks, or one given to the retrieval objective, is refused when the tuner is made, before any encoding."""
    corpus = tiny_corpus(topics=24)
    corpus["source"] = ["faq" if int(i[-2:]) < 10 else "guide" for i in corpus["id"]]
    with pytest.raises(PosfairInputError, match="test family 'manual' is not in the corpus; its families: faq, guide"):
        CalibrationTuner(corpus, test_family="manual")
    with pytest.raises(PosfairInputError, match="applies to the fairness objective only"):
        CalibrationTuner(corpus, objective="retrieval", test_family="faq")
    space = SearchSpace(basket_sizes=(4,), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0)
    tuner = CalibrationTuner(corpus, settings=SETTINGS, space=space, max_drop=1.0, test_family="faq",
                             cache_dir=tmp_path / "cache", name="fam")  # fmt: skip
    assert tuner.get_config_dict()["test_family"] == "faq"
    metrics = tuner(model)
    desc = tuner.last_result.objective
    assert desc["split_by"] == "family" and desc["test_family"] == "faq"
    assert metrics["fam_test_stock_documents"] > 0


def test_the_retrieval_tuner_gives_harm_changes_with_intervals(model, tmp_path):
    """The retrieval objective's score effect is Harm's change from stock (the rule `posfair retrieval` compares
    with), per trial with its interval over the split's queries resampled within their groups, and for the chosen
    setting on the test split: equal to the difference of the two trials' Harm as the evaluator computed it."""
    from posfair.retrieval.compare import harm_change
    from posfair.stats.intervals import grouped_interval
    from posfair.tuning.outputs import test_table
    from posfair.tuning.verdicts import test_score_effect

    bench = build_corpus_benchmark(model, tiny_corpus(topics=24), tmp_path / "bench")
    obj = RetrievalObjective(model, bench, store=tmp_path / "cache")
    space = SearchSpace(basket_sizes=(4, 8), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0,
                        variants=("uniform", "special"), special_shares=("original",))  # fmt: skip
    res = tune(model, objective=obj, space=space, max_drop=1.0)  # each variant's best is evaluated on test too
    assert res.effect == "Δharm" and len([t for t in res.trials if t.split == TEST and not t.stock]) >= 1
    for split in (DEV, TEST):
        stock = res.trial(STOCK, split).metrics["harm"]
        for t in res.trials:
            if t.split != split or t.stock:
                continue
            iv = res.intervals[f"{split}:{t.key}"].effect
            assert iv.effect == pytest.approx(t.metrics["harm"] - stock, abs=1e-12)
            groups = obj.score_units(t.calibration, split)
            assert sum(len(g) for g in groups) == iv.units == len(obj.splits[split].query_ids)
            low, high = grouped_interval(groups, harm_change)
            assert (iv.low, iv.high) == pytest.approx((low, high)) and low <= iv.effect <= high
    if res.chosen is STOCK:  # the tiny random model may keep stock: the effect of the variant's best, tested too
        res = dataclasses.replace(res, chosen=res.variant_best["uniform"])
        res.test_effect = test_score_effect(obj, res.trials, res.chosen, res.score)
    eff = res.test_effect
    assert eff.effect_name == "Δharm" and eff.effect == pytest.approx(eff.chosen - eff.stock)
    assert f"changes harm by {100 * eff.effect:+.2f}" in eff.verdict and eff.unit == "queries"
    assert res.headline()["test_score_effect"] == pytest.approx(eff.effect)
    cells = test_table(res).frame
    assert "Δharm [95 %]" in cells.columns and "removed [95 %]" not in cells.columns
