"""posfair's benchmarks as MTEB tasks: MTEB's per-group nDCG@10 (and Harm / PSI from it) equal posfair's.

Everything runs offline on the bundled model: the main benchmark is built from the bundled
corpus (its English sections, three per document, documents within the model's 256 tokens);
the small in-memory / on-disk benchmarks cover the layouts and the mistakes.
"""

from __future__ import annotations

import ast
import math
import warnings
from pathlib import Path

import mteb
import numpy as np
import pandas as pd
import pytest
from sentence_transformers import SentenceTransformer
from tests.retrieval.conftest import TOPICS

import posfair.mteb as pm
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.coverage import CalibrationFallbackWarning
from posfair.corpus import load_corpus
from posfair.model import bundled_model_path
from posfair.retrieval.benchmarks import RetrievalBenchmark, build_from_corpus, load_benchmark
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.retrieval.metrics import harmonic_mean, psi
from posfair.runtime.errors import PosfairInputError
from posfair.store import EmbeddingStore

CAL = Calibration()  # the default: B=128, last 50% of layers, strength 0.5
TOL = 1e-4  # MTEB rounds its scores to 5 decimals


def run(model_or_encoder, tasks, **kwargs):
    """``mteb.evaluate`` without a result cache unless one is given (calibration-coverage and MTEB's notices silenced)."""
    kwargs.setdefault("cache", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mteb.evaluate(model_or_encoder, tasks, show_progress_bar=False, **kwargs)


def posfair_metrics(bench, model, calibration=STOCK, **kwargs):
    """posfair's own evaluator on the same benchmark, its keys unprefixed (name="")."""
    kwargs.setdefault("name", "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PositionalRetrievalEvaluator(bench, calibration, **kwargs)(model)


def group_keys(metrics):
    return sorted(k for k in metrics if k.startswith("ndcg@10[seg"))


@pytest.fixture(scope="module")
def bench(model, tmp_path_factory):
    budget = model.max_seq_length - model.special_token_count()
    path = build_from_corpus(
        load_corpus(langs="en"),
        tmp_path_factory.mktemp("mteb-bench"),
        langs=["en"],
        k=3,
        max_doc_tokens=budget,
        count_tokens=lambda t: model.token_lengths(t, add_special_tokens=False).tolist(),
    )
    return load_benchmark(str(path), lang="en")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return EmbeddingStore(tmp_path_factory.mktemp("embeddings"))


@pytest.fixture(scope="module")
def reference(model, bench, store):
    """posfair's own evaluator, stock and calibrated (its embeddings kept in ``store``)."""
    return {
        "stock": posfair_metrics(bench, model, store=store),
        "calibrated": posfair_metrics(bench, model, CAL, store=store),
    }


@pytest.fixture(scope="module")
def tasks(bench):
    return pm.tasks(bench)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return mteb.ResultCache(tmp_path_factory.mktemp("mteb-cache"))


@pytest.fixture(scope="module")
def stock_encoder(model, store, reference):
    return pm.encoder(model, STOCK, store=store)


def stored(store):
    """What the store holds: one folder per (model, setting, prompt) namespace, and its shard files."""
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("part-*.arrow"))


@pytest.fixture(scope="module")
def mteb_runs(model, tasks, cache, store, stock_encoder):
    """MTEB's runs of the main benchmark.

    ``stock`` / ``calibrated``: posfair.mteb.encoder, into one MTEB result cache (MTEB's default overwrite
    strategy), reading the embeddings posfair's evaluator stored: a wrong setting or prompt would miss them and
    encode (and store) other vectors.  ``direct``: the calibrated FairModel itself given to mteb.evaluate
    (cache=None: MTEB knows it only by its name), every text encoded anew through MTEB's data loaders.
    """
    before = stored(store)
    out = {
        "stock": run(stock_encoder, tasks, cache=cache),
        "calibrated": run(pm.encoder(model, CAL, store=store), tasks, cache=cache),
    }
    out["stored_anew"] = sorted(set(stored(store)) - set(before))
    model.set_calibration(CAL)
    try:
        out["direct"] = run(model, tasks)
    finally:
        model.set_calibration(STOCK)
    return out


def test_tasks_have_one_subset_per_group(bench, tasks):
    (task,) = tasks
    assert isinstance(task, mteb.AbsTask) and task.metadata.type == "Retrieval"
    assert task.hf_subsets == list(bench.groups) == ["seg 1", "seg 2", "seg 3"]
    assert task.metadata.eval_splits == ["test"] and task.metadata.main_score == "ndcg_at_10"
    assert task.metadata.revision == pm.benchmark_digest(bench) and task.metadata.revision[:10] in task.metadata.name
    task.load_data()
    for label, mask in bench.groups.items():
        split = task.dataset[label]["test"]
        assert sorted(split["queries"]["id"]) == sorted(np.asarray(bench.query_ids)[mask].tolist())
        assert (
            split["corpus"]["text"] == bench.corpus_texts and split["top_ranked"] is None
        )  # one domain: the whole corpus
    task.unload_data()


def test_mteb_ndcg_per_group_equals_posfair(model, bench, tasks, reference, mteb_runs):
    assert model.calibration_coverage(bench.corpus_texts, CAL).calibrated > 0  # the calibration changes these documents
    assert mteb_runs["stored_anew"] == []  # MTEB asked for exactly what posfair's evaluator encoded
    scores = {}
    for run_name, setting in (("stock", "stock"), ("calibrated", "calibrated"), ("direct", "calibrated")):
        (s,) = pm.position_scores(mteb_runs[run_name], tasks).values()
        ref = reference[setting]
        assert list(s.groups) == ["seg 1", "seg 2", "seg 3"]
        for g, v in s.groups.items():
            assert v == pytest.approx(ref[f"ndcg@10[{g}]"], abs=TOL), (run_name, g)
            assert s.queries[g] == int(bench.groups[g].sum())
        # Harm and PSI from MTEB's scores, with posfair's definitions, equal the evaluator's
        assert s.harm == pytest.approx(ref["harm"], abs=TOL) and s.psi == pytest.approx(ref["psi"], abs=TOL)
        assert s.harm == harmonic_mean(s.groups) and s.psi == psi(s.groups)
        assert {k: s.metrics[k] for k in group_keys(ref)} == pytest.approx(
            {k: ref[k] for k in group_keys(ref)}, abs=TOL
        )
        scores[run_name] = s
    # calibration moves the per-group scores (MTEB measured the calibrated documents, not stock ones)
    for run_name in ("calibrated", "direct"):
        diff = [abs(scores[run_name].groups[g] - scores["stock"].groups[g]) for g in scores["stock"].groups]
        assert max(diff) > 10 * TOL, run_name


def test_result_cache_keeps_settings_apart(model, tasks, cache, mteb_runs):
    stock_meta = pm.encoder(model, STOCK).mteb_model_meta
    cal_meta = pm.encoder(model, CAL).mteb_model_meta
    assert stock_meta.name == cal_meta.name and stock_meta.experiment_name != cal_meta.experiment_name
    (name,) = [t.metadata.name for t in tasks]
    assert cache.load_task_result(name, stock_meta) is not None and cache.load_task_result(name, cal_meta) is not None
    # a rerun of the calibrated setting with MTEB's default strategy reads its own stored result: nothing is encoded
    again = pm.encoder(model, CAL)
    rerun = run(again, tasks, cache=cache)
    assert again.calibrated_share is None
    (s,) = pm.position_scores(rerun, tasks).values()
    (c,) = pm.position_scores(mteb_runs["calibrated"], tasks).values()
    (st,) = pm.position_scores(mteb_runs["stock"], tasks).values()
    assert s.groups == c.groups != st.groups


def test_calibrated_fairmodel_passed_directly_uses_its_calibration(model, tasks, mteb_runs):
    # the direct run above is checked against posfair's calibrated evaluator in test_mteb_ndcg_per_group_equals_posfair
    model.set_calibration(CAL)
    try:
        assert pm.encoder(model).calibration == CAL and pm.encoder(model, STOCK).calibration is STOCK
    finally:
        model.set_calibration(STOCK)
    assert pm.encoder(model).calibration is STOCK
    (direct,) = pm.position_scores(mteb_runs["direct"], tasks).values()
    (wrapped,) = pm.position_scores(mteb_runs["calibrated"], tasks).values()
    assert direct.groups == pytest.approx(wrapped.groups, abs=TOL)
    # MTEB records the directly passed model under its plain name: the reason to pass cache=None
    assert mteb_runs["direct"].model_name == pm.encoder(model, STOCK).mteb_model_meta.name


def test_model_prompts_pass_through(model, bench, reference, store, monkeypatch):
    monkeypatch.setattr(model, "prompts", {"query": "query: "})
    seen = []
    original = model.encode

    def spy(texts, *args, **kwargs):
        seen.append((kwargs.get("prompt"), len(texts)))
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(model, "encode", spy)
    (task,) = pm.tasks(bench)
    task.hf_subsets = ["seg 3"]
    # with posfair's store the documents come from the evaluator's stock run: only the queries are encoded, with the prompt
    result = run(pm.encoder(model, STOCK, store=store), [task])
    assert seen == [("query: ", int(bench.groups["seg 3"].sum()))]
    (entry,) = result.task_results[0].scores["test"]
    monkeypatch.setattr(model, "encode", original)
    with_prompt = posfair_metrics(bench, model, query_prompt_name="query", store=store)
    assert entry["ndcg_at_10"] == pytest.approx(with_prompt["ndcg@10[seg 3]"], abs=TOL)


def test_relpos_grouping_gives_posir_bucket_scores(bench, reference, stock_encoder, mteb_runs):
    (task,) = pm.tasks(bench, grouping="relpos")
    assert all(s.startswith("Q1.") for s in task.hf_subsets) and len(task.hf_subsets) > 5
    result = run(stock_encoder, [task])  # the corpus and queries are already encoded: only searched again
    (s,) = pm.position_scores(result).values()
    ref = reference["stock"]
    assert s.grouping == "relpos" and s.groups == {} and list(s.buckets) == ["Q1"]
    assert s.buckets["Q1"]["n"] == len(bench.query_ids)
    assert s.metrics["ndcg@10[Q1]"] == pytest.approx(ref["ndcg@10[Q1]"], abs=TOL)
    assert s.metrics["psi[Q1]"] == pytest.approx(ref["psi[Q1]"], abs=TOL)
    both = pm.tasks(bench, grouping="both")
    assert [t.grouping for t in both] == ["groups", "relpos"] and both[1].metadata.name == task.metadata.name


def write_posir(root, domains=("a", "b")):
    """The published PosIR layout (no segment positions): every domain holds the same topics in another order,
    with the same document ids, so a search across domains would rank other domains' copies too."""
    for k, domain in enumerate(domains):
        order = np.random.default_rng(k).permutation(6)
        d = root / "eng-Latn" / domain
        (d / "qrels").mkdir(parents=True)
        texts = [f"{TOPICS[i][1]}. More about {TOPICS[i][0]} on {domain} systems." for i in order]
        pd.DataFrame({"_id": [f"c{j}" for j in range(len(texts))], "text": texts}).to_parquet(d / "corpus.parquet")
        queries = pd.DataFrame(
            {
                "_id": [f"q{j}" for j in range(len(texts))],
                "text": [f"How do I use {TOPICS[i][0]}?" for i in order],
                "pos_char_span": [[0, 40] if j < 3 else [800, 840] for j in range(len(texts))],  # bins 0 and 16
                "pos_char_length": 1000,
                "pos_token_length": [[100, 700, 1200][j % 3] for j in range(len(texts))],  # buckets Q1, Q2, Q3
            }
        )
        queries.to_parquet(d / "queries.parquet")
        pd.DataFrame(
            {"query-id": queries["_id"], "corpus-id": [f"c{j}" for j in range(len(texts))], "score": 1}
        ).to_parquet(d / "qrels" / "test.parquet")
    return root


def test_posir_layout_searches_each_domain(model, tmp_path):
    bench = load_benchmark(str(write_posir(tmp_path / "posir")))
    assert not bench.groups and bench.is_posir and set(bench.query_domains) == {"a", "b"}
    (task,) = pm.tasks(str(tmp_path / "posir"))  # auto: relative-position subsets
    assert task.grouping == "relpos" and task.hf_subsets == [f"Q{k}.bin{b}" for k in (1, 2, 3) for b in ("00", "16")]
    task.load_data()
    split = task.dataset[task.hf_subsets[0]]["test"]
    qid = split["queries"]["id"][0]
    assert all(d.startswith(qid.split("/")[0] + "/") for d in split["top_ranked"][qid])  # own domain's documents only
    task.unload_data()
    (s,) = pm.position_scores(run(pm.encoder(model, STOCK), [task]), [task]).values()
    ref = posfair_metrics(bench, model)
    assert set(s.buckets) == {"Q1", "Q2", "Q3"}
    for bucket in s.buckets:
        assert s.metrics[f"ndcg@10[{bucket}]"] == pytest.approx(ref[f"ndcg@10[{bucket}]"], abs=TOL)
        assert s.metrics[f"psi[{bucket}]"] == pytest.approx(ref[f"psi[{bucket}]"], abs=TOL, nan_ok=True)


def test_fineweb_local_copy_overlapping_groups(model, tmp_path):
    rows = [
        {"question": f"How do I use {key}?", "content": f"{body}. See {key}.", "span_class": spans}
        for (key, body), spans in zip(TOPICS, [["beginning"], ["middle", "end"], ["end"], ["middle"]] * 3, strict=True)
    ]
    path = tmp_path / "fineweb.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    (task,) = pm.tasks(path)
    assert task.hf_subsets == ["begin", "middle", "end"] and task.metadata.eval_langs["end"] == ["eng-Latn"]
    (s,) = pm.position_scores(run(pm.encoder(model, STOCK), [task]), [task]).values()
    ref = posfair_metrics(load_benchmark(str(path)), model)
    assert s.queries == {"begin": 3, "middle": 6, "end": 6}  # a query in two groups counts in both
    assert s.metrics == pytest.approx({k: ref[k] for k in s.metrics}, abs=TOL)


def tiny_benchmark(**groups):
    texts = [f"{body}." for _, body in TOPICS[:4]]
    return RetrievalBenchmark(
        name="tiny",
        corpus_ids=[f"d{i}" for i in range(4)],
        corpus_texts=texts,
        query_ids=[f"q{i}" for i in range(4)],
        query_texts=[f"What about {key}?" for key, _ in TOPICS[:4]],
        qrels={f"q{i}": {f"d{i}": 1} for i in range(4)},
        groups={k: np.asarray(v, dtype=bool) for k, v in groups.items()},
        meta={"lang": "eng-Latn"},
    )


def test_missing_groups_are_warned_and_nan(model, bench, tasks, mteb_runs):
    tiny = tiny_benchmark(first=[1, 1, 0, 0], empty=[0, 0, 0, 0], last=[0, 0, 1, 1])
    with pytest.warns(pm.MissingGroupWarning, match="'empty' has no queries"):
        (task,) = pm.tasks(tiny)
    assert task.hf_subsets == ["first", "last"]
    (s,) = pm.position_scores(run(pm.encoder(model, STOCK), [task]), [task]).values()
    ref = posfair_metrics(tiny, model)
    assert (
        list(s.groups) == ["first", "empty", "last"]
        and math.isnan(s.groups["empty"])
        and math.isnan(ref["ndcg@10[empty]"])
    )
    assert s.harm == pytest.approx(ref["harm"], abs=TOL) and s.psi == pytest.approx(ref["psi"], abs=TOL)

    # results that lack a group: named with the tasks, counted without them
    tr = mteb_runs["stock"].task_results[0]
    partial = tr.model_copy(update={"scores": {"test": [e for e in tr.scores["test"] if e["hf_subset"] != "seg 2"]}})
    with pytest.warns(pm.MissingGroupWarning, match="missing: seg 2"):
        (s,) = pm.position_scores(partial, tasks).values()
    assert math.isnan(s.groups["seg 2"]) and s.harm == harmonic_mean([s.groups["seg 1"], s.groups["seg 3"]])
    with pytest.warns(pm.MissingGroupWarning, match="2 of its 3 subsets"):
        pm.position_scores([partial])
    fewer = tr.model_copy(
        update={
            "scores": {
                "test": [{**e, "posfair_queries": 5.0} if e["hf_subset"] == "seg 3" else e for e in tr.scores["test"]]
            }
        }
    )
    with pytest.warns(pm.MissingGroupWarning, match=rf"seg 3 \(5 of {int(bench.groups['seg 3'].sum())}\)"):
        pm.position_scores(fewer, tasks)
    with pytest.warns(pm.MissingGroupWarning, match="lack task"):
        pm.position_scores(mteb_runs["stock"], [*tasks, task])


def test_calibration_that_changes_nothing_is_reported(model):
    (task,) = pm.tasks(tiny_benchmark(a=[1, 1, 1, 1]))
    enc = pm.encoder(model, CAL)  # every tiny document is shorter than one basket of 128 tokens
    with pytest.warns(
        CalibrationFallbackWarning, match=r"MTEB task .*, documents: 4 of 4 texts are shorter than one basket"
    ):
        mteb.evaluate(enc, [task], cache=None, show_progress_bar=False)
    assert enc.calibrated_share == 0.0


@pytest.mark.parametrize("way", ["encoder", "FairModel", "task API"])
def test_show_progress_bar_false_draws_no_bar_and_warns_nothing(model, capfd, way):
    """``show_progress_bar=False`` is kept: no "Standardizing text corpus format" bar (MTEB's map converting a
    corpus, whose bar no option turns off: posfair's plain-text corpus reaches the model in MTEB's format without
    it) and no warning a user would see (MTEB asks every model its dimension by sentence-transformers 5.x's name,
    a FutureWarning on 6.x); the numbers are still posfair's evaluator's."""
    bench = tiny_benchmark(a=[1, 1, 1, 0], b=[0, 0, 0, 1])
    (task,) = pm.tasks(bench)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning each time, not once per place
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # as Python's own filters outside __main__
        if way == "task API":
            scores = task.evaluate(pm.encoder(model, STOCK), encode_kwargs={"show_progress_bar": False})
            got = {s: scores[s]["ndcg_at_10"] for s in task.hf_subsets}
        else:
            results = mteb.evaluate(
                pm.encoder(model, STOCK) if way == "encoder" else model, [task], cache=None, show_progress_bar=False
            )
            got = dict(next(iter(pm.position_scores(results, [task]).values())).groups)
    err = capfd.readouterr().err
    assert "Standardizing" not in err and "examples/s" not in err and "it/s" not in err, err
    assert [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught] == []
    ref = posfair_metrics(bench, model)
    assert got == pytest.approx({"a": ref["ndcg@10[a]"], "b": ref["ndcg@10[b]"]}, abs=TOL)


def test_bad_inputs(model, bench, tasks, mteb_runs):
    with pytest.raises(PosfairInputError, match="'rows'"):
        pm.tasks(bench, grouping="rows")
    with pytest.raises(PosfairInputError, match="got int 3"):
        pm.tasks(3)
    with pytest.raises(PosfairInputError, match="unknown benchmark 'no-such-bench'"):
        pm.tasks("no-such-bench")
    with pytest.raises(PosfairInputError, match="no positional groups"):
        pm.tasks(tiny_benchmark())
    with pytest.raises(PosfairInputError, match="grouping='relpos' needs"):
        pm.tasks(tiny_benchmark(a=[1, 1, 1, 1]), grouping="relpos")
    with pytest.raises(PosfairInputError, match="'xx-Latn'"):
        pm.tasks(tiny_benchmark(a=[1, 1, 1, 1]), languages=["xx-Latn"])
    unnamed = tiny_benchmark(a=[1, 1, 1, 1])
    unnamed.meta = {}
    with pytest.raises(PosfairInputError, match="records no language"):
        pm.tasks(unnamed)
    with pytest.raises(PosfairInputError, match="'default'"):
        pm.encoder(model, "default")
    with pytest.raises(PosfairInputError, match="got str"):
        pm.encoder("all-MiniLM-L6-v2")
    plain = SentenceTransformer(str(bundled_model_path()), device="cpu")
    assert pm.encoder(plain).calibration is STOCK
    with pytest.raises(PosfairInputError, match="SentenceTransformer cannot calibrate"):
        pm.encoder(plain, CAL)
    (tiny,) = pm.tasks(tiny_benchmark(a=[1, 1, 1, 1]))
    with pytest.raises(PosfairInputError, match="precision='int8'"):
        run(pm.encoder(model, STOCK), [tiny], encode_kwargs={"precision": "int8"})
    with pytest.raises(PosfairInputError, match="got dict"):
        pm.position_scores({"scores": {}})
    with pytest.raises(PosfairInputError, match="no result of a posfair task"):
        pm.position_scores(
            mteb_runs["stock"]
            .task_results[0]
            .model_copy(update={"task_name": "x", "scores": {"test": [{"hf_subset": "a"}]}})
        )
    with pytest.raises(PosfairInputError, match="tasks must be"):
        pm.position_scores(mteb_runs["stock"], [object()])


def test_only_posfair_mteb_imports_mteb():
    """``import posfair`` (and every other module) stays free of mteb: only ``posfair.mteb`` imports it."""
    package = Path(pm.__file__).parent  # src/posfair/mteb/
    root = package.parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if package in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                hit = any(
                    a.name.split(".")[0] == "mteb" or f"{a.name}.".startswith("posfair.mteb.") for a in node.names
                )
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = {a.name for a in node.names}
                hit = (
                    module.split(".")[0] == "mteb"
                    or f"{module}.".startswith("posfair.mteb.")
                    or ("mteb" in names and (module == "posfair" or node.level))
                )
            else:
                continue
            if hit:
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
