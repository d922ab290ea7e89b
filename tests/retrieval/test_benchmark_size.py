"""A benchmark's size and what it resolves: one rule for build-benchmark, retrieval, sweep and tune."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from posfair.cli import app
from posfair.retrieval.benchmarks import MIN_QUERIES_PER_GROUP, BenchmarkSize, RetrievalBenchmark, resolution_points


def test_resolution_by_hand():
    # 95 % half-width of a mean of q scores in [0, 1] with the largest standard deviation (0.5), in points
    assert resolution_points(100) == pytest.approx(100 * 1.96 * 0.5 / 10)
    assert resolution_points(4) == pytest.approx(49.0)
    assert resolution_points(0) == float("inf")


def test_the_smallest_group_decides():
    ok = BenchmarkSize("b", 60, 180, {"seg 1": 60, "seg 2": 60, "seg 3": 60})
    assert not ok.too_small and ok.warning() is None and "±13 points" in ok.line()
    small = BenchmarkSize("b", 60, 150, {"seg 1": 60, "seg 2": 60, "seg 3": 29})
    assert small.too_small and "29 queries in its smallest positional group (fewer than 30)" in small.warning("do X")
    assert small.warning("do X").endswith("; do X")
    few_docs = BenchmarkSize("b", 3, 7, {"seg 1": 3, "seg 2": 2, "seg 3": 2})
    assert "3 documents (fewer than 30)" in few_docs.warning() and "±69 nDCG@10 points" in few_docs.warning()


def test_size_of_a_benchmark_counts_its_groups():
    n = 40
    bench = RetrievalBenchmark(
        name="t", corpus_ids=[f"d{i}" for i in range(n)], corpus_texts=[f"text {i}" for i in range(n)],
        query_ids=[f"q{i}" for i in range(n)], query_texts=[f"query {i}" for i in range(n)],
        qrels={f"q{i}": {f"d{i}": 1} for i in range(n)},
        groups={"seg 1": np.arange(n) % 2 == 0, "seg 2": np.arange(n) % 2 == 1},
    )  # fmt: skip
    size = bench.size()
    assert (size.documents, size.queries, size.per_group) == (n, n, {"seg 1": 20, "seg 2": 20})
    assert size.too_small and size.smallest == 20 < MIN_QUERIES_PER_GROUP


def test_build_benchmark_warns_when_the_benchmark_cannot_separate_methods(tmp_path):
    r = CliRunner().invoke(app, ["build-benchmark", "--out", str(tmp_path / "bench"), "--langs", "en", "--k", "3"])
    assert r.exit_code == 0, r.output
    docs = json.loads((tmp_path / "bench" / "benchmark.json").read_text())["documents"]
    assert 0 < docs < MIN_QUERIES_PER_GROUP  # at the bundled model's 256 tokens few documents of 3 sections fit
    assert f"benchmark aligned[eng-Latn]: {docs} documents" in r.stdout.replace("\n", " ")
    warned = [
        line for line in r.stderr.splitlines() if line.startswith("warning: benchmark aligned[eng-Latn] is too small")
    ]
    assert len(warned) == 1 and f"{docs} documents (fewer than 30)" in warned[0] and "--max-seq-length" in warned[0]
