"""Where a query is searched: its own domain's documents (default) or the whole loaded corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.retrieval.test_mteb import write_posir

from posfair.calibration import STOCK
from posfair.encoding import l2_normalize
from posfair.retrieval import PositionalRetrievalEvaluator, RetrievalResult, load_benchmark, run_sweep


def _embeddings(model, bench):
    q = l2_normalize(model.encode(bench.query_texts, calibration=STOCK))
    d = l2_normalize(model.encode(bench.corpus_texts, calibration=STOCK))
    return q, d


def test_domain_and_corpus_scopes_against_a_hand_search(model, tmp_path):
    bench = load_benchmark(str(write_posir(tmp_path / "posir")))
    q, d = _embeddings(model, bench)
    scores = q @ d.T
    domains = np.asarray(bench.query_domains, dtype=object)
    corpus_domains = np.asarray(bench.corpus_domains, dtype=object)
    by_domain = PositionalRetrievalEvaluator(bench).retrieve(q, d)
    whole = PositionalRetrievalEvaluator(bench, search_scope="corpus").retrieve(q, d)
    for i in range(len(q)):
        own = np.flatnonzero(corpus_domains == domains[i])
        want_own = own[np.argsort(-scores[i, own], kind="stable")]
        assert by_domain[i, : len(own)].tolist() == want_own.tolist() and (by_domain[i, len(own) :] == -1).all()
        want_all = np.argsort(-scores[i], kind="stable")[: whole.shape[1]]
        assert whole[i, : len(want_all)].tolist() == want_all.tolist()
    # the two domains hold copies of the same topics: searched together, some queries meet the other domain's copy
    assert any(corpus_domains[whole[i, 0]] != domains[i] for i in range(len(q)))


def test_the_scope_is_recorded_and_a_sweep_refuses_to_mix_scopes(model, tmp_path):
    bench = load_benchmark(str(write_posir(tmp_path / "posir")))
    result = PositionalRetrievalEvaluator(bench, search_scope="corpus").evaluate(model)
    assert result.search_scope == "corpus"
    assert RetrievalResult.from_dict(json.loads(json.dumps(result.to_dict()))).search_scope == "corpus"
    assert PositionalRetrievalEvaluator(bench).evaluate(model).search_scope == "domain"
    run_sweep(model, bench, [], tmp_path / "sweep")
    assert json.loads((tmp_path / "sweep" / "retrieval.json").read_text())["search_scope"] == "domain"
    with pytest.raises(ValueError, match="different search_scope"):
        run_sweep(model, bench, [], tmp_path / "sweep", search_scope="corpus")
    with pytest.raises(ValueError, match="search_scope must be one of domain, corpus; got 'all'"):
        PositionalRetrievalEvaluator(bench, search_scope="all")
