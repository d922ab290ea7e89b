"""Late chunking: span pooling against a manual forward pass, the max / mean aggregation, the evaluator and the sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.retrieval.conftest import aligned_corpus

from posfair.retrieval.benchmarks import build_from_corpus, load_posir
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.retrieval.late import LateChunking, late_scores
from posfair.retrieval.result_tables import group_table
from posfair.retrieval.resumable_sweep import run_sweep
from posfair.runtime.errors import PosfairInputError
from posfair.store import EmbeddingStore

TEXT = "  The apt tool installs packages. Kernel modules load at boot; printers use cups and queues.  "


def _manual_windows(model, text: str, window: int) -> np.ndarray:
    """Final hidden states from the transformer itself, averaged over consecutive windows of content tokens."""
    text = text.strip()
    tok = model.tokenizer(text, return_tensors="pt", return_special_tokens_mask=True)
    special = tok.pop("special_tokens_mask")[0].bool().numpy()
    with torch.no_grad():
        states = model[0].auto_model(**tok).last_hidden_state[0].double().numpy()
    content = np.flatnonzero(~special)
    return np.stack([states[content[i : i + window]].mean(axis=0) for i in range(0, len(content), window)])


@pytest.mark.parametrize("arch", ["bert-mean", "bert", "qwen3"])
def test_span_pooling_matches_a_manual_forward_pass(tiny_model, arch):
    model = tiny_model(arch)
    late = LateChunking(chunks=4)
    vecs, owner = late.embed(model, [TEXT, "Short one."])
    manual = _manual_windows(model, TEXT, 4)
    assert len(manual) > 3  # several windows
    assert owner.tolist() == [0] * len(manual) + [1] * len(_manual_windows(model, "Short one.", 4))
    np.testing.assert_allclose(vecs[: len(manual)], manual, atol=2e-5)
    # the spans are windows of 4 content tokens on the stripped text
    spans = late.spans(model, [TEXT.strip()])[0]
    assert spans[0][0] == 0 and spans[-1][1] == len(TEXT.strip())


def test_chunks_beyond_the_token_limit_are_dropped_and_counted(tiny_model, monkeypatch):
    model = tiny_model("bert-mean")
    long = ("word " * 600).strip()  # 600 tokens, 2999 characters
    content = model.max_seq_length - 2  # content tokens the model sees
    windows = LateChunking(chunks=100)
    with pytest.warns(UserWarning, match="truncated"):  # the encoding layer says the passage is cut at the limit
        vecs, _ = windows.embed(model, [long])
    assert len(vecs) == -(-content // 100) and windows.dropped(model, [long]) == 0  # windows of the truncated passage
    semantic = LateChunking(chunks="semantic")
    cut = 5 * content  # character where the token limit falls ("word " per token)
    spans = [(0, 100), (100, cut - 50), (cut - 50, cut + 100), (cut + 100, len(long))]
    monkeypatch.setattr(semantic.sea, "chunk_spans", lambda m, texts: [spans for _ in texts])
    with pytest.warns(UserWarning, match="truncated"):
        vecs, owner = semantic.embed(model, [long])
    assert len(vecs) == 3 and semantic.dropped(model, [long]) == 1  # the span past the limit holds no token
    assert semantic.spans(model, [long])[0] == spans[:3]


def test_late_scores_max_and_mean_against_a_loop():
    rng = np.random.default_rng(0)
    q, c = rng.normal(size=(3, 5)), rng.normal(size=(7, 5))
    owner = np.array([0, 0, 1, 2, 2, 2, 3])
    for agg, f in (("max", np.max), ("mean", np.mean)):
        got = late_scores(q, c, owner, 4, agg)
        want = np.array([[f([q[i] @ c[j] for j in range(7) if owner[j] == d]) for d in range(4)] for i in range(3)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="at least one chunk"):
        late_scores(q, c, owner, 5, "max")


def test_options_are_validated():
    with pytest.raises(PosfairInputError, match="aggregate"):
        LateChunking(aggregate="median")
    with pytest.raises(PosfairInputError, match="window"):
        LateChunking(chunks=0)
    with pytest.raises(PosfairInputError, match="semantic"):
        LateChunking(chunks="sentences")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = build_from_corpus(
        aligned_corpus(), tmp_path_factory.mktemp("bench"), langs=["en"], k=2, seed=3, max_doc_tokens=None
    )
    return load_posir(out, lang="en")


def test_evaluator_ranks_by_the_aggregate_of_chunk_cosines(model, bench, tmp_path):
    store = EmbeddingStore(tmp_path / "cache")
    max_late, mean_late = LateChunking.variants(["max", "mean"], chunks=16)
    assert max_late.span_cache is mean_late.span_cache
    for late in (max_late, mean_late):
        ev = PositionalRetrievalEvaluator(bench, late, store=store)
        r = ev.evaluate(model)
        assert (
            r.method == "late"
            and r.setting == f"late-{late.aggregate} (16-token windows)"
            and r.calibrated_share is None
        )
        q = ev.encode_queries(model)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        vecs, owner = late.embed(model, bench.corpus_texts)
        vecs = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
        # manual: per query, every document's aggregate over its chunks, then sort
        assert len(list(bench.domain_slices())) == 1
        ranked = ev.retrieve_late(q, vecs, owner)
        for i in range(len(q)):
            per_doc = [getattr(np, late.aggregate)(vecs[owner == d] @ q[i]) for d in range(len(bench.corpus_texts))]
            top = np.argsort(-np.asarray(per_doc), kind="stable")[:10]
            assert np.array_equal(ranked[i][: len(top)], top) and (ranked[i][len(top) :] == -1).all()
        assert r.late["chunks_total"] == len(owner) and r.late["chunks_dropped"] == 0


def test_sweep_tables_hold_late_chunking(model, bench, tmp_path):
    late = LateChunking.variants(["max", "mean"], chunks=16)
    results = run_sweep(model, bench, [], tmp_path / "sweep", late=late)
    assert [r.method for r in results] == ["stock", "late", "late"]
    table = group_table(results)
    assert table["setting"].tolist() == [
        "stock",
        "late-max (16-token windows)",
        "late-mean (16-token windows)",
    ]
    assert np.isfinite(table["Harm"]).all() and (tmp_path / "sweep" / "table_groups.md").exists()
    # rerun: read back from runs/, identical
    again = run_sweep(model, bench, [], tmp_path / "sweep", late=LateChunking.variants(["max", "mean"], chunks=16))
    assert [r.metrics for r in again] == [r.metrics for r in results]
