"""``posfair encode``: ids a Parquet output cannot hold are refused at read (issue 38, item 9); memory running out
while encoding is one line saying so and what to lower (item 11)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from posfair.cli import app
from posfair.files.reading import check_ids
from posfair.runtime.errors import PosfairInputError


def run(*args):
    return CliRunner().invoke(app, list(map(str, args)))


@pytest.fixture
def no_model(monkeypatch):
    from posfair.cli import checks

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "ids,message",
    [
        ([1, 2**70], "line 2: 'id' is 1180591620717411303424, outside the 64-bit integers a Parquet column holds"),
        ([-1, 2**63], "line 2: 'id' is 9223372036854775808, outside the 64-bit integers a Parquet column holds"),
        ([-(2**63) - 1, 1], "line 1: 'id' is -9223372036854775809, outside the 64-bit integers a Parquet column holds"),
        (["a", "b\ud800"], "line 2: 'id' holds an unpaired UTF-16 surrogate (U+D800 at character 2)"),
    ],
)
def test_an_id_parquet_cannot_hold_is_refused_before_any_work(tmp_path, no_model, ids, message):
    path = _jsonl(tmp_path / "in.jsonl", [{"text": f"text {i}", "id": v} for i, v in enumerate(ids)])
    r = run("encode", "-i", path, "--id-field", "id", "-o", tmp_path / "out.parquet")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {path}: {message}") and r.stderr.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]  # no output, no temporary cache left behind


def test_a_text_with_a_lone_surrogate_is_refused_before_any_work(tmp_path, no_model):
    path = _jsonl(tmp_path / "in.jsonl", [{"text": "fine"}, {"text": "bro\udc80ken"}])
    r = run("encode", "-i", path, "-o", tmp_path / "out.npy")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(
        f"error: {path}: line 2: 'text' holds an unpaired UTF-16 surrogate (U+DC80 at character 4)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]


def test_ids_that_fit_64_bits_pass_and_round_trip_through_parquet(tmp_path):
    """The edges of the accepted ranges are written to Parquet and read back unchanged."""
    for ids in ([-(2**63), 2**63 - 1, 0], [0, 2**64 - 1, 5]):
        got = check_ids(ids, "in.jsonl", "id", [1, 2, 3])
        pd.DataFrame({"id": got}).to_parquet(tmp_path / "ids.parquet")
        assert pd.read_parquet(tmp_path / "ids.parquet")["id"].tolist() == ids
    with pytest.raises(PosfairInputError, match="row 1: 'id' is 18446744073709551616"):
        check_ids([0, 2**64], "in.parquet", "id")


_TORCH_CPU = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "2147483648 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize(
    "error",
    [RuntimeError(_TORCH_CPU), MemoryError(), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")],
    ids=["torch-cpu", "MemoryError", "cuda"],
)
def test_memory_running_out_while_encoding_is_one_line(tmp_path, monkeypatch, error):
    """The model's forward pass fails as torch fails when memory runs out (the error injected where torch raises it:
    a subprocess under RLIMIT_AS dies in the tokenizer's allocator first, or takes minutes)."""
    from posfair.model import FairModel

    def forward(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(FairModel, "forward", forward)
    (tmp_path / "in.txt").write_text("one text\nanother text\n")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy", "--batch-size", "16")
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: memory ran out ({type(error).__name__}")
    assert lines[0].endswith("): lower --batch-size (now 16) or --max-seq-length (now the model's own)")
    assert "unexpected" not in r.stderr and ": )" not in r.stderr and not (tmp_path / "out.npy").exists()


def test_memory_advice_names_the_given_max_seq_length(tmp_path, monkeypatch):
    from posfair.model import FairModel

    monkeypatch.setattr(FairModel, "forward", lambda self, *a, **k: (_ for _ in ()).throw(MemoryError("no room")))
    (tmp_path / "in.txt").write_text("one text\n")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy", "--max-seq-length", "128")
    assert r.exit_code == 1
    assert r.stderr == (
        "error: memory ran out (MemoryError: no room): lower --batch-size (now 32) or --max-seq-length (now 128)\n"
    )
