"""Terminal lines a newcomer reads: a readable build-benchmark summary (no raw JSON), counts in the right number,
stores' namespaces named by what they hold, encode saying when its calibration changed nothing, one precision per
column of the attention table (issue 40 item 4)."""

from __future__ import annotations

import json

import pytest
from tests.retrieval.conftest import aligned_corpus
from typer.testing import CliRunner

from posfair.cli import app
from posfair.cli.attention import _cell
from posfair.cli.terminal_tables import plural


def test_build_benchmark_prints_a_sentence_not_its_settings_file(tmp_path):
    src = tmp_path / "corpus.jsonl"
    aligned_corpus().to_json(src, orient="records", lines=True)
    out = tmp_path / "bench"
    r = CliRunner().invoke(app, ["build-benchmark", "--corpus", str(src), "--out", str(out), "--langs", "en,de",
                                 "--k", "3", "--max-doc-tokens", "0"])  # fmt: skip
    assert r.exit_code == 0, r.output
    info = json.loads((out / "benchmark.json").read_text())
    assert "token_counts" not in r.stdout and "{" not in r.stdout
    assert f"benchmark {info['name']} written to {out}" in r.stdout
    assert f"{info['documents']} documents of 3 segments each, languages eng-Latn, deu-Latn" in r.stdout


def test_encode_says_a_calibration_changed_nothing_and_verify_names_what_a_namespace_holds(tiny_model_path, tmp_path):
    path, _ = tiny_model_path("bert-mean")
    src = tmp_path / "texts.jsonl"
    src.write_text('{"id": 1, "text": "a cat"}\n{"id": 2, "text": "two dogs"}\n')
    cache = tmp_path / "cache"
    r = CliRunner().invoke(app, ["encode", "-i", str(src), "-o", str(tmp_path / "e.npy"), "--model", str(path),
                                 "--calibration", "64,1,1", "--cache", str(cache)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "stock: B64-Llast1-a1 calibrated none of the 2 distinct texts" in r.stdout  # texts of a few tokens, B=64
    v = CliRunner().invoke(app, ["verify", str(cache)])
    assert v.exit_code == 0, v.output
    assert "all 1 shard of 1 namespace verified (2 rows)" in v.stdout
    row = v.stdout.splitlines()[2]  # under the header and its underline
    assert row.endswith("B64-Llast1-a1") and "embedding, model " in row


@pytest.mark.parametrize(("n", "text"), [(0, "0 shards"), (1, "1 shard"), (2, "2 shards"), (1234, "1,234 shards")])
def test_plural(n, text):
    assert plural(n, "shard") == text


def test_attention_cells_have_one_precision_per_kind_of_column():
    cells = [_cell("BOS", 0.1796), _cell("EOS", 0.005414), _cell("first half / second half (bins)", 1.103)]
    assert cells == ["0.1796", "0.0054", "1.1030"]
    assert _cell("documents", 40.0) == "40" and _cell("calibrated_share", float("nan")) == "—"


def test_encode_reads_its_texts_from_corpus_as_every_command_and_keeps_input():
    import click
    import typer

    group = typer.main.get_command(app)
    encode = group.get_command(click.Context(group), "encode")
    opts = next(p.opts + p.secondary_opts for p in encode.params if "--corpus" in p.opts)
    assert opts[:2] == ["--corpus", "-c"] and {"--input", "-i"} <= set(opts)  # the former name still works
