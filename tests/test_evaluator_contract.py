"""posfair's three evaluators keep sentence-transformers' ``BaseEvaluator`` contract on the installed stack.

What sentence-transformers and its trainer rely on: ``evaluator(model, output_path, epoch, steps)``
returns a dict of floats prefixed with the evaluator's ``name``; ``primary_metric`` is one of its
keys (the trainer logs it as ``eval_{primary_metric}``; ``SequentialEvaluator`` reads it after each
call); ``greater_is_better`` is a bool; the model card keys the results by the evaluator, so
evaluators hash and compare by identity.  Each evaluator runs for real on a seeded tiny model.
"""

from __future__ import annotations

import json

import pytest
from tests.fairness.conftest import tiny_corpus
from tests.retrieval.conftest import aligned_corpus

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.pipeline import PositionalFairnessEvaluator
from posfair.model import compat
from posfair.retrieval.benchmarks import build_from_corpus, load_benchmark
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.runtime.errors import PosfairInputError
from posfair.tuning import CalibrationTuner, FunctionObjective, SearchSpace

if compat.ST_6:
    from sentence_transformers.sentence_transformer.evaluation import SequentialEvaluator
else:
    from sentence_transformers.evaluation import SequentialEvaluator

CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)
SETTINGS = AuditSettings(n_values=(3,), configs=("en",), target_docs=12, min_segment_tokens=1, max_segment_tokens=60,
                         batch_size=8, chunk_size=8, control=False)  # fmt: skip
SPACE = SearchSpace(basket_sizes=(8, 16), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=1)
KINDS = ("fairness", "retrieval", "tuner")


def _synthetic(cal, split):
    """A tuner objective with a known shape (lower score is better), computed without a model."""
    if cal is STOCK:
        return {"score": 1.0, "guard": 1.0}
    return {"score": (cal.strength - 0.7) ** 2 + cal.basket_size / 1000, "guard": 1.0 - 0.01 * cal.strength}


@pytest.fixture(scope="module")
def model(tiny_model_path):
    path, pooling = tiny_model_path("bert-mean")
    return posfair.load_model(path, pooling=pooling, device="cpu")  # its own copy: the evaluators write its model card


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = build_from_corpus(
        aligned_corpus(), tmp_path_factory.mktemp("bench"), langs=["en"], k=3, seed=3, max_doc_tokens=None
    )
    return load_benchmark(str(out), lang="en")


def make(kind: str, bench, **kwargs):
    if kind == "fairness":
        return PositionalFairnessEvaluator(tiny_corpus(topics=6), SETTINGS, [CAL], **kwargs)
    if kind == "retrieval":
        return PositionalRetrievalEvaluator(bench, CAL, **kwargs)
    return CalibrationTuner(objective=FunctionObjective(_synthetic), space=SPACE, max_drop=0.1, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_follows_the_base_evaluator_contract(kind, model, bench, tmp_path):
    ev, twin = make(kind, bench), make(kind, bench)
    assert isinstance(ev, compat.BaseEvaluator)
    assert ev.name and isinstance(ev.greater_is_better, bool)
    key = ev.primary_metric  # known before the first call: what metric_for_best_model takes
    assert isinstance(key, str) and key.startswith(f"{ev.name}_")
    # hashed and compared by identity (sentence-transformers keys its model card by evaluator)
    assert ev == ev and ev != twin and len({ev, twin, ev}) == 2 and {ev: 1, twin: 2}[ev] == 1

    metrics = ev(model, output_path=str(tmp_path / "eval"), epoch=0.5, steps=3)  # as the trainer calls it
    assert metrics and all(k.startswith(f"{ev.name}_") for k in metrics)
    assert all(type(v) is float for v in metrics.values())
    assert ev.primary_metric == key and key in metrics  # not prefixed again by the call
    assert model.model_card_data.eval_results_dict[ev] == metrics
    assert any("_epoch0.50_steps3" in p.name for p in (tmp_path / "eval").iterdir())  # the training step's outputs
    assert isinstance(ev.description, str) and ev.description
    json.dumps(ev.get_config_dict())  # the model card writes it as JSON

    again = ev(model)  # a second call: the same keys, the same (deterministic) figures
    assert set(again) == set(metrics) and ev.primary_metric == key
    assert again[key] == pytest.approx(metrics[key])


def test_primary_metric_follows_the_name(model, bench):
    ev = PositionalRetrievalEvaluator(bench, CAL, name="a")
    assert ev.primary_metric == "a_harm"
    ev.name = "b"
    assert ev.primary_metric == "b_harm" and "b_harm" in ev(model)
    ev.name = ""  # bare metric names, as sentence-transformers' evaluators without a name
    assert ev.primary_metric == "harm" and set(ev(model)) >= {"harm", "psi", "ndcg@10", "calibrated_share"}
    ev.name = "c"
    ev.primary_metric = "c_psi"  # what sentence-transformers' prefix_name_to_metrics assigns
    assert ev.primary_metric == "c_psi" and ev.base_metric == "psi"
    ev.primary_metric = "ndcg@10"
    assert ev.primary_metric == "c_ndcg@10"


def test_direction_of_each_primary_metric(bench):
    assert make("fairness", bench).greater_is_better is True  # mean later beta of sigma: towards 0 from below
    assert make("retrieval", bench).greater_is_better is True  # Harm
    assert CalibrationTuner(tiny_corpus(), objective="fairness").greater_is_better is False  # profile spread
    assert CalibrationTuner(objective="retrieval", benchmark=bench).greater_is_better is True  # Harm
    higher = CalibrationTuner(objective=FunctionObjective(_synthetic, greater_is_better=True))
    assert higher.greater_is_better is True and higher.primary_metric == "tune_test_chosen_score"


def test_default_retrieval_names_keep_settings_apart(model, bench):
    stock, calibrated = PositionalRetrievalEvaluator(bench), PositionalRetrievalEvaluator(bench, CAL)
    assert stock.name != calibrated.name and CAL.label() in calibrated.name
    out = SequentialEvaluator([stock, calibrated])(model)
    assert stock.primary_metric in out and calibrated.primary_metric in out
    assert out[f"{calibrated.name}_calibrated_share"] == 1.0 and f"{stock.name}_calibrated_share" not in out


def test_in_a_sequential_evaluator(model, bench):
    evaluators = [make(kind, bench) for kind in KINDS]
    out = SequentialEvaluator(evaluators)(model)
    assert all(ev.primary_metric in out for ev in evaluators)
    assert out["sequential_score"] == out[evaluators[-1].primary_metric]
    for ev in evaluators:
        assert model.model_card_data.eval_results_dict[ev] == {
            k: v for k, v in out.items() if k.startswith(f"{ev.name}_")
        }


def test_bad_input_is_refused_at_construction(bench):
    corpus = tiny_corpus()
    cases = [
        (lambda: PositionalFairnessEvaluator(corpus, name=3), "name must be a string"),
        (lambda: PositionalFairnessEvaluator("corpus.jsonl"), "corpus must be a pandas DataFrame"),
        (lambda: PositionalFairnessEvaluator(corpus, {"n_values": (3,)}), "settings must be an AuditSettings"),
        (lambda: PositionalFairnessEvaluator(corpus, calibrations=[CAL, CAL]), "duplicate calibrations"),
        (lambda: PositionalRetrievalEvaluator("bench"), "benchmark must be a RetrievalBenchmark"),
        (lambda: PositionalRetrievalEvaluator(bench, "B8"), "documents must be posfair.STOCK, a posfair.Calibration"),
        (lambda: PositionalRetrievalEvaluator(bench, top_k=5), "top_k must be >= 10"),
        (lambda: PositionalRetrievalEvaluator(bench, name=1.5), "name must be a string"),
        (lambda: CalibrationTuner(corpus, objective="speed"), "objective must be"),
        (lambda: CalibrationTuner(objective="fairness"), "needs a corpus"),
        (lambda: CalibrationTuner(corpus, objective="fairness", score="harm"), "'spread' or 'max_abs_beta'"),
        (lambda: CalibrationTuner(objective="retrieval"), "needs a benchmark or a corpus"),
        (lambda: CalibrationTuner(objective="retrieval", benchmark=bench, score="spread"), "optimises Harm"),
    ]
    for build, match in cases:
        with pytest.raises(PosfairInputError, match=match):
            build()
