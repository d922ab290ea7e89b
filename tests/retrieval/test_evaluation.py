import dataclasses
import functools
import json

import numpy as np
import pytest
from tests.retrieval.conftest import aligned_corpus

from posfair import Calibration
from posfair.retrieval.benchmarks import build_from_corpus, load_posir
from posfair.retrieval.evaluator import QWEN3_QUERY_PROMPT, PositionalRetrievalEvaluator, default_query_prompt
from posfair.retrieval.result_tables import bucket_table, group_table, to_latex, to_markdown
from posfair.retrieval.resumable_sweep import paper_grid, run_sweep, strength_sweep
from posfair.retrieval.sea import SegmentEmbedAverage
from posfair.store import EmbeddingStore

CAL = Calibration(basket_size=16, layers=0.5, strength=0.5)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = build_from_corpus(
        aligned_corpus(), tmp_path_factory.mktemp("bench"), langs=["en", "de"], k=3, seed=3, max_doc_tokens=None
    )
    return load_posir(out, lang="en")


def test_evaluator_protocol_and_metrics(model, bench, tmp_path):
    import ir_measures
    from ir_measures import nDCG

    store = EmbeddingStore(tmp_path / "cache")
    stock = PositionalRetrievalEvaluator(bench, store=store)
    cal = PositionalRetrievalEvaluator(bench, CAL, store=store)
    m = stock(model, output_path=str(tmp_path / "out"))
    assert stock.primary_metric == f"{stock.name}_harm" and stock.primary_metric in m
    assert {k.removeprefix(f"{stock.name}_") for k in m} >= {"ndcg@10", "harm", "psi", "ndcg@10[seg 1]", "psi[Q1]"}
    assert list((tmp_path / "out").glob("*.json"))
    # queries are encoded stock under both settings; documents differ
    q0, q1 = stock.encode_queries(model), cal.encode_queries(model)
    assert np.array_equal(q0, q1)
    d0, d1 = stock.encode_documents(model), cal.encode_documents(model)
    assert not np.allclose(d0, d1)
    ref_docs = model.encode(bench.corpus_texts, calibration=CAL, normalize_embeddings=True, convert_to_numpy=True)
    assert np.allclose(d1, ref_docs, atol=1e-5)
    # metric values agree with ir_measures on the same run
    r = cal.evaluate(model)
    scores = q1 @ d1.T
    run = [
        ir_measures.ScoredDoc(qid, bench.corpus_ids[j], float(scores[i, j]))
        for i, qid in enumerate(bench.query_ids)
        for j in range(len(bench.corpus_ids))
    ]
    qrels = [ir_measures.Qrel(qid, did, s) for qid, rel in bench.qrels.items() for did, s in rel.items()]
    ref = {x.query_id: x.value for x in ir_measures.iter_calc([nDCG @ 10], qrels, run)}
    assert r.ndcg == pytest.approx([ref[q] for q in bench.query_ids], abs=1e-6)
    assert r.metrics["ndcg@10[seg 2]"] == pytest.approx(
        np.mean([ref[q] for q, g in zip(bench.query_ids, bench.groups["seg 2"], strict=True) if g])
    )


def test_query_prompts(model, bench):
    assert default_query_prompt(model) is None
    model_name = type("M", (), {"name_or_path": "Qwen/Qwen3-Embedding-0.6B"})()
    assert default_query_prompt(model_name) == QWEN3_QUERY_PROMPT
    ev = PositionalRetrievalEvaluator(bench, query_prompt="query: ")
    expected = model.encode(
        ["query: " + t for t in bench.query_texts[:3]], normalize_embeddings=True, convert_to_numpy=True
    )
    assert np.allclose(ev.encode_queries(model)[:3], expected, atol=1e-5)
    with pytest.raises(ValueError, match="no prompt named"):
        PositionalRetrievalEvaluator(bench, query_prompt_name="nope").encode_queries(model)


def test_sea_is_mean_of_semantic_chunks(model):
    sea = SegmentEmbedAverage(threshold=0.5, min_characters_per_sentence=10)
    text = (
        "Apt installs packages from the archive. It resolves dependencies. It downloads files from mirrors. "
        "The printer needs cups. Queues hold print jobs. Jobs are sent to the printer. Drivers render pages. "
        "Sound comes from alsa. The mixer sets volume. Speakers play audio."
    )
    chunks = sea.chunk(model, [text])[0]
    assert "".join(chunks) == text  # chunks partition the passage
    vec = sea.embed(model, [text])[0]
    ref = model.encode(chunks, normalize_embeddings=True, convert_to_numpy=True).mean(axis=0)
    assert np.allclose(vec, ref, atol=1e-5)


def test_tables_layout(model, bench, tmp_path):
    results = run_sweep(model, bench, [CAL, Calibration(basket_size=16, layers=1, strength=1.0)], tmp_path)
    t1 = group_table(results)
    assert list(t1.columns) == [
        "section",
        "setting",
        "seg 1",
        "seg 2",
        "seg 3",
        "Harm",
        "PSI",
        "nDCG@10",
        "calibrated_share",
        "best",
    ]
    assert t1["setting"].tolist() == ["stock", "B16-Llast1-a1", "B16-L0.5-a0.5"]
    assert t1["section"].tolist() == ["", "Last layer", "50% of layers"]
    assert t1["best"].sum() >= 1 and t1.loc[t1["best"], "Harm"].max() == t1["Harm"].max()
    stock = results[0]
    assert t1.loc[0, "Harm"] == round(100 * stock.metrics["harm"], 2)
    t2 = bucket_table(results)
    assert {"PSI Q1", "ΔPSI Q1", "nDCG@10", "ΔnDCG@10"} <= set(t2.columns)
    assert np.isnan(t2.loc[0, "ΔnDCG@10"])
    assert "**" in to_markdown(t1) and r"\textbf" in to_latex(t1)
    assert (tmp_path / "table_groups.md").exists() and (tmp_path / "table_buckets.tex").exists()


def test_grids():
    g = paper_grid()
    assert len(g) == 12 and {c.basket_size for c in g} == {128, 256, 512} and {c.layers for c in g} == {1, 0.5}
    s = strength_sweep(step=0.05)
    assert len(s) == 40 and s[0].strength == 0.05 and s[19].strength == 1.0


def test_killed_sweep_resumes_with_identical_tables(model, bench, tmp_path):
    cals = strength_sweep(
        basket_size=16, layer_sets=[0.5], step=0.5
    )  # strengths 0.5, 1.0 -> with stock a Figure 3 series
    results = run_sweep(model, bench, cals, tmp_path / "ref", encode_chunk=2)
    expected = {p.name: p.read_text() for p in (tmp_path / "ref").glob("table_*")}
    assert (tmp_path / "ref" / "strength.png").exists()
    from posfair.report.plots import figure_heading, layout_problems
    from posfair.retrieval.result_tables import strength_figure

    fig = strength_figure(results, 16)
    heading = figure_heading(fig)
    assert layout_problems(fig) == [] and "baskets of 16 tokens" in heading
    assert results[0].model and results[0].model in heading and f"token limit {model.max_seq_length}" in heading
    # the curves are the results: per group and for Harm, 100 x (calibrated - stock) at strengths 0 (stock), .5, 1;
    # on this small benchmark calibration leaves nDCG as stock's, so the calibrated points are moved by known amounts
    stock = next(r for r in results if r.method == "stock")
    moved = [r if r is stock else dataclasses.replace(
        r, groups={g: v - 0.01 * (i + 1) * r.calibration["strength"] for i, (g, v) in enumerate(r.groups.items())},
        metrics=r.metrics | {"harm": r.metrics["harm"] - 0.05 * r.calibration["strength"]}) for r in results]  # fmt: skip
    by_strength = {Calibration.from_dict(r.calibration).strength: r for r in moved if r.method == "calibrated"}
    drawn = {line.get_label(): line.get_xydata() for line in strength_figure(moved, 16).axes[0].get_lines()}
    curves = {g: (lambda r, g=g: r.groups[g]) for g in stock.groups} | {"Harm": lambda r: r.metrics["harm"]}
    for label, value in curves.items():
        want = [(0.0, 0.0)] + [(s, 100 * (value(by_strength[s]) - value(stock))) for s in (0.5, 1.0)]
        np.testing.assert_allclose(drawn[label], want, atol=1e-9, err_msg=label)
    # issue 49 item 5: every basket size evaluated has its row of panels (not only one), the y axis its unit
    other = [dataclasses.replace(r, calibration=r.calibration | {"basket_size": 32}) for r in moved if r is not stock]
    every = strength_figure([*moved, *other])
    assert layout_problems(every) == []
    titles = sorted(ax.get_title() for ax in every.axes if ax.get_visible())
    assert titles == ["50% of layers, B=16", "50% of layers, B=32"]
    assert all("points" in ax.get_ylabel() for ax in every.axes if ax.get_visible() and ax.get_ylabel())

    calls = {"n": 0}
    original = model.encode

    @functools.wraps(original)
    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 9:  # queries done, stock documents done, killed inside the first calibrated run
            raise KeyboardInterrupt("killed")
        return original(*args, **kwargs)

    model.encode = dying
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sweep(model, bench, cals, tmp_path / "resumed", encode_chunk=2)
    finally:
        del model.encode
    assert (tmp_path / "resumed" / "runs" / "stock.json").exists()
    assert not list((tmp_path / "resumed").glob("table_*"))
    stored = sum(1 for _ in (tmp_path / "resumed" / "embeddings").rglob("part-*.arrow"))
    assert stored > 0
    run_sweep(model, bench, cals, tmp_path / "resumed", encode_chunk=2)
    got = {p.name: p.read_text() for p in (tmp_path / "resumed").glob("table_*")}
    assert got == expected
    manifest = json.loads((tmp_path / "resumed" / "retrieval.json").read_text())
    with pytest.raises(ValueError, match="different top_k"):
        run_sweep(model, bench, cals, tmp_path / "resumed", top_k=50)
    assert manifest["model"] == model.fingerprint


def test_progress_callback_counts_every_distinct_text(model, bench, tmp_path):
    done: dict[str, list[int]] = {}

    def progress(desc, total, already):
        done[desc] = [total]
        return done[desc].append

    PositionalRetrievalEvaluator(bench, CAL, store=tmp_path / "cache", progress=progress, encode_chunk=2).evaluate(
        model
    )
    assert {d: (t[0], sum(t[1:])) for d, t in done.items()} == {
        f"{bench.name}: queries (stock)": (len(set(bench.query_texts)), len(set(bench.query_texts))),
        f"{bench.name}: documents ({CAL.label()})": (len(set(bench.corpus_texts)), len(set(bench.corpus_texts))),
    }
