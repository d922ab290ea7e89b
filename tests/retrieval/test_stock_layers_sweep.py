"""A sweep whose stock documents come from the store still computes the calibrations' stock layers once: one stock
pass (vectors discarded) when the layers it saves outnumber the model's; the same results as without it."""

import logging
import re

import pytest
from tests.retrieval.conftest import aligned_corpus

from posfair import Calibration
from posfair.model import stock_layers
from posfair.retrieval.benchmarks import build_from_corpus, load_posir
from posfair.retrieval.resumable_sweep import run_sweep
from posfair.store import EmbeddingStore

#: MiniLM has 6 layers: first calibrated layers 5 and 3 save 8 layers against the stock pass's 6
CALS = [Calibration(basket_size=16, layers=1, strength=1.0), Calibration(basket_size=16, layers=0.5, strength=0.5)]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = build_from_corpus(
        aligned_corpus(), tmp_path_factory.mktemp("bench"), langs=["en", "de"], k=3, seed=3, max_doc_tokens=None
    )
    return load_posir(out, lang="en")


def _figures(results):
    return [(r.setting, list(r.ndcg), dict(r.metrics)) for r in results]


def test_a_sweep_over_stored_stock_documents_shares_their_stock_layers(model, bench, tmp_path, caplog, monkeypatch):
    store = EmbeddingStore(tmp_path / "cache")
    run_sweep(model, bench, [Calibration(basket_size=16, layers=0.5, strength=1.0)], tmp_path / "first", store=store)
    with caplog.at_level(logging.DEBUG, logger="posfair.retrieval.resumable_sweep"):
        got = run_sweep(model, bench, CALS, tmp_path / "second", store=store)
    said = caplog.text
    assert "a stock pass over the documents (stored already)" in said
    shared = re.search(r"(\d+) calibrated batch\(es\) started there .* (\d+) computed in full", said)
    assert shared and int(shared[1]) > 0 and int(shared[2]) == 0, said
    # fewer layers saved than a stock pass costs (one calibration starting at layer 3): no stock pass
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="posfair.retrieval.resumable_sweep"):
        run_sweep(
            model, bench, [Calibration(basket_size=32, layers=0.5, strength=1.0)], tmp_path / "third", store=store
        )
    assert "a stock pass" not in caplog.text
    # nothing shared anywhere, a fresh store: the same figures
    monkeypatch.setattr(stock_layers, "batch_part", lambda *a, **k: None)
    ref = run_sweep(model, bench, CALS, tmp_path / "ref", store=EmbeddingStore(tmp_path / "ref-cache"))
    assert _figures(got) == _figures(ref)
