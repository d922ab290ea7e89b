"""posfair's evaluators in a real ``SentenceTransformerTrainer`` run, with a calibrated model.

A seeded tiny mean-pooled BERT with a default calibration is fine-tuned for a few steps
(MultipleNegativesRankingLoss on in-memory pairs); the fairness audit and the retrieval
evaluation, both calibrated, run every two steps; the best checkpoint by a posfair metric is
reloaded at the end.  Checked: the ``eval_``-prefixed posfair metrics in the log history, the
checkpoint the trainer picks, and that the model in memory afterwards *is* that checkpoint
(weights, default calibration, pooling), compared with the checkpoint folder loaded on its own
through ``posfair.load_model`` (not with the folder's files, whose format is posfair's business).

Needs the trainer's ``accelerate`` (the ``train`` extra, in ``dev``); runs on both stacks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from tests.fairness.conftest import tiny_corpus
from tests.retrieval.conftest import aligned_corpus
from transformers import TrainerCallback

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.fairness.experiment import AuditSettings
from posfair.fairness.pipeline import PositionalFairnessEvaluator
from posfair.model import compat
from posfair.retrieval.benchmarks import build_from_corpus, load_benchmark
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator

if compat.ST_6:
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
else:
    from sentence_transformers.losses import MultipleNegativesRankingLoss

CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)
SETTINGS = AuditSettings(n_values=(3,), configs=("en",), target_docs=12, min_segment_tokens=1, max_segment_tokens=60,
                         batch_size=8, chunk_size=8, control=False)  # fmt: skip
STEPS, EVERY = 6, 2


class MoveOnAfterTheLastCheckpoint(TrainerCallback):
    """After the last checkpoint is written, change the weights in memory (as further training would).

    Whichever checkpoint is best, the model in memory then matches none of them unless the trainer
    really reloads the best one at the end.
    """

    def on_save(self, args, state, control, model=None, **kwargs):
        if state.global_step >= state.max_steps:
            gen = torch.Generator().manual_seed(123)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))


def _best_step(evals: list[dict], key: str, greater_is_better: bool) -> tuple[int, float]:
    """The trainer's rule: the first evaluation strictly better than every earlier one wins."""
    best = evals[0]
    for e in evals[1:]:
        if (e[key] > best[key]) if greater_is_better else (e[key] < best[key]):
            best = e
    return best["step"], best[key]


def test_trainer_reloads_the_best_calibrated_checkpoint(tiny_model_path, tmp_path):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling, device="cpu").set_calibration(CAL)
    bench = load_benchmark(
        str(build_from_corpus(aligned_corpus(), tmp_path / "bench", langs=["en"], k=3, seed=3, max_doc_tokens=None)),
        lang="en",
    )
    texts = bench.corpus_texts
    assert model.calibration_coverage(texts).calibrated == len(texts)  # the calibration changes every document
    stock_before = model.encode(texts, calibration=STOCK)

    fairness = PositionalFairnessEvaluator(
        tiny_corpus(topics=8), SETTINGS, [model.calibration], name="fair", write_report=False
    )
    retrieval = PositionalRetrievalEvaluator(bench, model.calibration)
    key, greater = retrieval.primary_metric, retrieval.greater_is_better
    pairs = aligned_corpus().query("lang == 'en'")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=5e-3, seed=0,
        eval_strategy="steps", eval_steps=EVERY, save_strategy="steps", save_steps=EVERY, logging_steps=EVERY,
        load_best_model_at_end=True, metric_for_best_model=key, greater_is_better=greater,
        save_only_model=True, report_to="none", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"anchor": pairs["title"].tolist(), "positive": pairs["text"].tolist()}),
        loss=MultipleNegativesRankingLoss(model),
        evaluator=[fairness, retrieval],  # the trainer wraps a list in a SequentialEvaluator
        callbacks=[MoveOnAfterTheLastCheckpoint()],
    )
    trainer.train()

    # every evaluation logged the posfair metrics under the names the trainer looks up
    evals = [e for e in trainer.state.log_history if f"eval_{key}" in e]
    assert [e["step"] for e in evals] == list(range(EVERY, STEPS + 1, EVERY))
    calibrated_audit_share = [k for k in evals[0] if k.startswith("eval_fair_") and k.endswith("_calibrated_share")]
    assert len(calibrated_audit_share) == 1
    for e in evals:
        assert np.isfinite(e[f"eval_{key}"]) and np.isfinite(e[f"eval_{fairness.primary_metric}"])
        assert e[f"eval_{retrieval.name}_calibrated_share"] == 1.0 and e[calibrated_audit_share[0]] > 0
    assert len({e[f"eval_{fairness.primary_metric}"] for e in evals}) == len(evals)  # each evaluation saw new weights

    # the checkpoint chosen is the one with the best posfair metric
    best_step, best_value = _best_step(evals, f"eval_{key}", greater)
    best_dir = tmp_path / "run" / f"checkpoint-{best_step}"
    assert trainer.state.best_model_checkpoint == str(best_dir)
    assert trainer.state.best_metric == pytest.approx(best_value)

    # after training the model in memory is that checkpoint: weights, default calibration, pooling
    assert model.calibration == CAL and model.pooling == "mean"
    reloaded = posfair.load_model(best_dir, device="cpu")
    assert reloaded.calibration == CAL and reloaded.pooling == "mean"
    in_memory = model.encode(texts)
    assert np.allclose(in_memory, reloaded.encode(texts), atol=1e-5)
    assert np.allclose(model.encode(texts, calibration=STOCK), reloaded.encode(texts, calibration=STOCK), atol=1e-5)
    assert not np.allclose(in_memory, model.encode(texts, calibration=STOCK), atol=1e-4)  # calibrated, not stock
    assert not np.allclose(model.encode(texts, calibration=STOCK), stock_before, atol=1e-4)  # and trained
    assert retrieval(model)[key] == pytest.approx(best_value)  # the figure the trainer chose it by
    for other in (tmp_path / "run").glob("checkpoint-*"):
        if other != best_dir:  # in particular the last one, which the callback moved away from
            assert not np.allclose(in_memory, posfair.load_model(other, device="cpu").encode(texts), atol=1e-5), (
                other.name
            )


def test_saving_a_calibrated_model_writes_its_usage_snippet_calibrated(tiny_model_path, tmp_path, caplog):
    """sentence-transformers' model card encodes its usage examples inside ``save``: with posfair's module shown
    as a stock Transformer for the save, that used to fail ('Transformer' object has no attribute 'resolve') and
    lose the snippet; it now encodes calibrated, as the model does, and the module is posfair's again after."""
    import logging

    from posfair.model.calibrated_transformer import CalibratedTransformer

    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling, device="cpu").set_calibration(CAL)
    seen = []
    real = type(model)._encode

    def spy(self, inputs=None, *args, **kwargs):
        out = real(self, inputs, *args, **kwargs)
        seen.append((list(inputs) if not isinstance(inputs, str) else [inputs], np.asarray(out)))
        return out

    type(model)._encode = spy
    try:
        with caplog.at_level(logging.WARNING):
            model.save(str(tmp_path / "saved"))
    finally:
        type(model)._encode = real
    assert not [r for r in caplog.records if "usage snippet" in r.getMessage()], caplog.text
    assert seen, "the model card encoded nothing"
    for texts, out in seen:  # what the card encoded is the calibrated embedding
        np.testing.assert_allclose(out, model.encode(texts, calibration=CAL), atol=1e-5)
    assert isinstance(model.transformer_module, CalibratedTransformer)
