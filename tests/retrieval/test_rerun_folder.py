"""A rerun into an existing retrieval folder reuses only results made from the same content (issue 38, item 1)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from tests.retrieval.conftest import build_cli_benchmark
from typer.testing import CliRunner

from posfair.cli import app
from posfair.files.run_folder import MANIFEST
from posfair.retrieval.benchmarks import load_benchmark


def _retrieval(bench, out):
    return CliRunner().invoke(
        app, ["retrieval", "--benchmark", str(bench), "--no-stock", "--calibration", "16,0.5,0.5", "--out", str(out)]
    )


def _ndcg(out) -> float:
    return float(pd.read_csv(out / "table_groups.csv")["nDCG@10"].iloc[0])


def test_a_benchmark_with_the_same_counts_but_other_qrels_is_not_answered_from_the_old_results(tmp_path):
    bench = build_cli_benchmark(tmp_path)
    first = _retrieval(bench, tmp_path / "R")
    assert first.exit_code == 0, first.output
    before = _ndcg(tmp_path / "R")
    # the same number of queries and documents, other judgements: every query of the first document now points at
    # the last document
    qrels_path = bench / "eng-Latn" / "all" / "qrels" / "test.parquet"
    qrels = pd.read_parquet(qrels_path)
    docs = sorted(qrels["corpus-id"].unique())
    qrels.loc[qrels["corpus-id"] == docs[0], "corpus-id"] = docs[-1]
    qrels.to_parquet(qrels_path)
    rerun = _retrieval(bench, tmp_path / "R")
    assert rerun.exit_code == 2, rerun.output
    errors = [line for line in rerun.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {tmp_path / 'R'} holds retrieval results made from a different benchmark content (documents, queries, "
        "qrels or positions): they cannot be reused; choose another --out (or move that folder away)"
    ]
    assert _ndcg(tmp_path / "R") == before  # the old results are left as they were
    fresh = _retrieval(bench, tmp_path / "R2")
    assert fresh.exit_code == 0, fresh.output
    assert _ndcg(tmp_path / "R2") != before  # the change matters: reusing the old figures would have been wrong
    files = json.loads((tmp_path / "R2" / MANIFEST).read_text())["files"]
    assert "table_groups.csv" in files and "retrieval.json" in files


def test_a_finished_run_of_another_sweep_is_evaluated_again_not_read(tmp_path, monkeypatch):
    bench = build_cli_benchmark(tmp_path)
    monkeypatch.chdir(tmp_path)  # the folder as a user gives it: relative to the working directory
    assert _retrieval(bench, "R").exit_code == 0
    shards = {p: p.read_bytes() for p in (tmp_path / "R" / "embeddings").rglob("part-*.arrow")}
    assert shards
    run = next((tmp_path / "R" / "runs").glob("*.json"))
    body = json.loads(run.read_text())
    body["metrics"]["ndcg@10"] = 0.123456  # a planted figure from elsewhere, under another sweep's fingerprint
    body["ndcg"] = [0.123456] * len(body["ndcg"])
    body["sweep"] = "0" * 20
    run.write_text(json.dumps(body))
    res = _retrieval(bench, "R")
    assert res.exit_code == 0, res.output
    assert abs(_ndcg(tmp_path / "R") - 12.35) > 1e-6
    assert json.loads(run.read_text())["sweep"] != "0" * 20
    # the embedding cache is the folder's state: every shard is still there, none listed as a file of the run
    assert all(p.read_bytes() == b for p, b in shards.items())
    assert not [f for f in json.loads((tmp_path / "R" / MANIFEST).read_text())["files"] if f.startswith("embeddings")]


def test_the_benchmark_fingerprint_follows_content_not_name_or_path(tmp_path):
    bench = build_cli_benchmark(tmp_path)
    a = load_benchmark(str(bench), lang="en")
    copy = tmp_path / "copy-of-bench"
    copy.mkdir()
    for p in bench.rglob("*"):
        if p.is_file():
            (copy / p.relative_to(bench)).parent.mkdir(parents=True, exist_ok=True)
            (copy / p.relative_to(bench)).write_bytes(p.read_bytes())
    assert load_benchmark(str(copy), lang="en").fingerprint() == a.fingerprint()
    queries_path = bench / "eng-Latn" / "all" / "queries.parquet"
    q = pd.read_parquet(queries_path)
    q["segment_position"] = q["segment_position"].to_numpy()[np.r_[1 : len(q), 0]]  # positions moved, counts kept
    q.to_parquet(queries_path)
    assert load_benchmark(str(bench), lang="en").fingerprint() != a.fingerprint()
