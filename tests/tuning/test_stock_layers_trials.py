"""The tuner's trials share the stock layers below each trial's first calibrated layer (``posfair.model.stock_layers``):
kept from the first trial's stock pass, used by every later trial, released after the search; the same numbers."""

import sys
from pathlib import Path

import pandas as pd
import pytest

from posfair import Calibration
from posfair.model import stock_layers
from posfair.tuning import DEV, FairnessObjective, default_fairness_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402

SETTINGS = default_fairness_settings(
    target_docs=24, min_segment_tokens=1, max_segment_tokens=60, batch_size=8, chunk_size=8
)
#: first calibrated layers 2, 1 and 3 of the tiny model's 4
CALS = [Calibration(basket_size=4, layers=x, strength=1.0) for x in (0.5, 0.75, 0.25)]


@pytest.fixture
def model(tiny_model):
    return tiny_model("bert-mean")


def test_trials_share_the_stock_layers_and_get_the_same_numbers(model, tmp_path, monkeypatch):
    obj = FairnessObjective(model, tiny_corpus(topics=12), SETTINGS, store=tmp_path / "shared")
    got = [obj.observations([c], DEV) for c in CALS]
    kept = obj._stock_layers
    assert kept.starts == (1, 2, 3) and kept.kept
    # every calibrated batch of every trial (segments and documents) started above layer 0
    assert kept.batches_shared > 0 and kept.batches_not_found == 0, kept.summary()
    obj.release()
    assert not kept.kept
    # the same trials with nothing shared anywhere: the same observations, bit for bit
    monkeypatch.setattr(stock_layers, "batch_part", lambda *a, **k: None)
    ref_obj = FairnessObjective(model, tiny_corpus(topics=12), SETTINGS, store=tmp_path / "separate")
    for c, g in zip(CALS, got, strict=True):
        pd.testing.assert_frame_equal(g, ref_obj.observations([c], DEV), check_exact=True)


def test_retrieval_trials_share_the_stock_layers_and_get_the_same_numbers(model, tmp_path, monkeypatch):
    from posfair.calibration import STOCK
    from posfair.tuning import RetrievalObjective
    from posfair.tuning.tuner import build_corpus_benchmark

    bench = build_corpus_benchmark(model, tiny_corpus(topics=24), tmp_path / "bench")
    obj = RetrievalObjective(model, bench, store=tmp_path / "shared")
    got = [obj.evaluate(c, DEV) for c in (STOCK, *CALS)]  # the search evaluates stock first
    kept = obj.stock_layers()
    assert kept.batches_shared > 0 and kept.batches_not_found == 0, kept.summary()
    obj.release()
    monkeypatch.setattr(stock_layers, "batch_part", lambda *a, **k: None)
    ref_obj = RetrievalObjective(model, bench, store=tmp_path / "separate")
    assert [ref_obj.evaluate(c, DEV) for c in (STOCK, *CALS)] == got
    for c in CALS:
        pd.testing.assert_series_equal(obj.guard_units(c, DEV), ref_obj.guard_units(c, DEV), check_exact=True)
