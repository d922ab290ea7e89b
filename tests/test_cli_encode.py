"""``posfair encode``: inputs, outputs, calibration options, resume, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from posfair import Calibration
from posfair.cli import app

TEXTS = [
    "Debian is a free operating system. " * 6,
    "How do I install a package?",
    "The installer runs in many languages.",
]


def run(*args):
    result = CliRunner().invoke(app, list(map(str, args)))
    return result


def test_txt_to_npy_matches_library(tmp_path, minilm):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy", "--calibration", "8,0.5,1.0")
    assert r.exit_code == 0, r.output
    got = np.load(tmp_path / "out.npy", allow_pickle=False)
    want = minilm.encode(TEXTS, calibration=Calibration(8, 0.5, 1.0))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["in.txt", "out.npy"]  # temporary cache removed after success


def test_jsonl_to_parquet_with_ids_and_separate_options(tmp_path, minilm):
    lines = [json.dumps({"doc": f"d{i}", "body": t}) for i, t in enumerate(TEXTS)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines))
    r = run("encode", "-i", tmp_path / "in.jsonl", "-o", tmp_path / "out.parquet", "--text-field", "body",
            "--id-field", "doc", "--basket-size", "8", "--strength", "1", "--normalize")  # fmt: skip
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(tmp_path / "out.parquet")
    assert df["doc"].tolist() == ["d0", "d1", "d2"]
    want = minilm.encode(TEXTS, calibration=Calibration(basket_size=8, strength=1.0), normalize_embeddings=True)
    np.testing.assert_allclose(np.stack(df["embedding"].to_numpy()), want, atol=1e-5)


def test_parquet_input_and_kept_cache_reused(tmp_path):
    pd.DataFrame({"text": TEXTS}).to_parquet(tmp_path / "in.parquet")
    args = ("encode", "-i", tmp_path / "in.parquet", "-o", tmp_path / "a.npy", "--cache", tmp_path / "cache")
    assert run(*args).exit_code == 0
    shards = sorted((tmp_path / "cache").rglob("part-*.arrow"))
    assert shards
    assert run(*args).exit_code == 0
    assert sorted((tmp_path / "cache").rglob("part-*.arrow")) == shards  # nothing recomputed


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command loads a model (bad input must be refused before any work)."""
    from posfair.cli import checks

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


@pytest.mark.parametrize(
    "name,content,extra,message",
    [
        ("in.jsonl", '{"text": "ok"}\n{"other": 1}\n', (), "{path}: line 2 has no 'text' field"),
        (
            "in.jsonl",
            '{"text": "ok"}\n{broken\n',
            (),
            "{path}: line 2 is not valid JSON (Expecting property name enclosed in double quotes)",
        ),
        (
            "in.jsonl",
            '{"text": "ok"}\n["a list"]\n',
            (),
            "{path}: line 2 is a JSON list, not an object with a 'text' field",
        ),
        ("in.csv", "a,b\n", (), "{path}: unsupported input type '.csv': use .txt, .jsonl or .parquet"),
        ("in.jsonl", '{"text": "ok"}\n{"text": "  "}\n', (), "{path}: line 2: 'text' is empty"),
        ("in.jsonl", '{"text": "ok"}\n{"text": null}\n', (), "{path}: line 2: 'text' is null"),
        (
            "in.jsonl",
            '{"text": "ok"}\n\n{"text": 123}\n{"text": null}\n',
            (),
            "{path}: line 3: 'text' is an int (123), not a string (2 unusable texts in all)",
        ),
        (
            "in.jsonl",
            '{"text": "ok", "doc": 1}\n{"text": "ok"}\n',
            ("--id-field", "doc", "-o", "{tmp}/o.parquet"),
            "{path}: line 2 has no 'doc' field",
        ),
        ("in.jsonl", "", (), "{path}: no texts to embed (the input is empty)"),
        ("in.jsonl", "\n  \n", (), "{path}: no texts to embed (the input is empty)"),
        ("in.txt", "", (), "{path}: no texts to embed (the input is empty)"),
        ("in.txt", "\n\n", (), "{path}: no texts to embed (the input is empty)"),
        ("in.txt", "first\n\nthird\n", (), "{path}: line 2: 'text' is empty"),
        ("in.txt", "fine\n", ("--strength", "2"), "--strength 2: must be a number in [0, 1]; got 2"),
        ("missing.txt", None, (), "input file {path} does not exist"),
    ],
)
def test_bad_input_is_refused_by_name_before_any_work(tmp_path, no_model, name, content, extra, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    r = run("encode", "-i", path, "-o", tmp_path / "o.npy", *(e.format(tmp=tmp_path) for e in extra))  # a later -o wins
    assert r.exit_code == 2
    assert r.stderr == f"error: {message.format(path=path)}\n"
    assert not (tmp_path / "o.npy").exists() and [f.name for f in tmp_path.iterdir()] == (
        [name] if content is not None else []
    )


@pytest.mark.parametrize(
    "column,message",
    [
        (["ok", None, "fine"], "row 1: 'text' is null"),
        ([1, 2], "row 0: 'text' is an int (1), not a string (2 unusable texts in all)"),
        (["ok", "   "], "row 1: 'text' is empty"),
        ([], "no texts to embed (the input is empty)"),
    ],
)
def test_bad_parquet_rows_are_named(tmp_path, no_model, column, message):
    path = tmp_path / "in.parquet"
    pd.DataFrame({"text": pd.Series(column, dtype=object)}).to_parquet(path)
    r = run("encode", "-i", path, "-o", tmp_path / "o.npy")
    assert r.exit_code == 2 and r.stderr == f"error: {path}: {message}\n"


def test_an_output_that_is_a_folder_is_refused(tmp_path, no_model):
    (tmp_path / "in.txt").write_text("fine\n")
    (tmp_path / "dir.npy").mkdir()
    (tmp_path / "dir.npy" / "keep").write_text("mine")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "dir.npy")
    assert r.exit_code == 2 and r.stderr == f"error: --out {tmp_path / 'dir.npy'}: is an existing folder, not a file\n"
    assert [f.name for f in (tmp_path / "dir.npy").iterdir()] == ["keep"]
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "in.txt" / "o.npy")
    assert (
        r.exit_code == 2
        and r.stderr == f"error: --out {tmp_path / 'in.txt' / 'o.npy'}: {tmp_path / 'in.txt'} is a file, not a folder\n"
    )


@pytest.fixture
def tiny(tiny_model_path):
    path, pooling = tiny_model_path("bert")
    return ("--model", path, "--pooling", pooling)


def test_a_folder_posfair_did_not_create_is_never_deleted(tmp_path, tiny):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    for name in ("out.npy.cache", ".out.npy.posfair-cache"):  # the old default name, and posfair's own name
        (tmp_path / name).mkdir()
        (tmp_path / name / "sentinel").write_text("user data")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy", *tiny)
    assert r.exit_code == 0, r.output
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        ".out.npy.posfair-cache",
        "in.txt",
        "out.npy",
        "out.npy.cache",
    ]
    for name in ("out.npy.cache", ".out.npy.posfair-cache"):
        assert [f.name for f in (tmp_path / name).iterdir()] == ["sentinel"]
        assert (tmp_path / name / "sentinel").read_text() == "user data"


def test_an_interrupted_run_without_cache_resumes_then_cleans_up(tmp_path, tiny, monkeypatch):
    from posfair.model import FairModel

    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy", "--chunk-size", "1", *tiny)
    real = FairModel.encode
    calls = []

    def crash_on_second(self, sentences, *a, **k):
        calls.append(list(sentences))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real(self, sentences, *a, **k)

    monkeypatch.setattr(FairModel, "encode", crash_on_second)
    assert run(*args).exit_code != 0
    temp = tmp_path / ".out.npy.posfair-cache"
    assert len(list(temp.glob("*/part-*.arrow"))) == 1 and (temp / ".posfair-temporary-cache").is_file()
    calls.clear()
    monkeypatch.setattr(FairModel, "encode", lambda self, s, *a, **k: calls.append(list(s)) or real(self, s, *a, **k))
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert calls == [[TEXTS[1]], [TEXTS[2]]]  # the finished chunk was not recomputed
    assert not temp.exists() and sorted(f.name for f in tmp_path.iterdir()) == ["in.txt", "out.npy"]


def test_a_damaged_cache_shard_is_named_set_aside_and_recomputed(tmp_path, tiny):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ("encode", "-i", tmp_path / "in.txt", "--chunk-size", "1", *tiny)
    assert run(*args, "-o", tmp_path / "clean.npy").exit_code == 0
    assert run(*args, "-o", tmp_path / "a.npy", "--cache", tmp_path / "cache").exit_code == 0
    shard = sorted((tmp_path / "cache").glob("*/part-*.arrow"))[0]
    shard.write_bytes(shard.read_bytes()[:-50])
    r = run(*args, "-o", tmp_path / "b.npy", "--cache", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    size = shard.with_name(shard.name + ".damaged-1").stat().st_size
    assert [line for line in r.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: damaged cache shard {shard} (not a complete Arrow IPC file: {size} bytes, cut short or overwritten): "
        f"moved to {shard}.damaged-1; its vectors are recomputed"
    ]
    clean = np.load(tmp_path / "clean.npy", allow_pickle=False)
    np.testing.assert_allclose(np.load(tmp_path / "b.npy", allow_pickle=False), clean, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy", allow_pickle=False), clean)


def test_a_cache_of_other_settings_is_refused(tmp_path, tiny):
    from posfair.store import code_version

    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "a.npy", "--cache", tmp_path / "cache", *tiny)
    assert run(*args).exit_code == 0
    manifest_file = next((tmp_path / "cache").glob("*/manifest.json"))
    manifest = json.loads(manifest_file.read_text())
    assert (
        manifest["dim"] == 64
        and manifest["calibration"] is None
        and manifest["code_hash"] == code_version()["code_hash"]
    )
    manifest_file.write_text(json.dumps({**manifest, "posfair_version": "0.0.1"}))
    r = run(*args)
    ns = manifest_file.parent
    assert r.exit_code == 2 and r.stderr.splitlines()[-1] == (  # (after the model's loading progress)
        f"error: store {ns} was made with other settings (posfair_version: the store has '0.0.1', this run has "
        f"'{code_version()['posfair_version']}'): refusing to mix them; use another store folder, or delete {ns} to recompute it"
    )
    assert not (tmp_path / "cache").joinpath(ns.name, "manifest.json.damaged-1").exists()


def test_every_command_is_mounted():
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"encode", "audit", "demo", "attention", "retrieval", "sweep", "build-benchmark", "tune", "embed"} <= names


def test_calibration_specs_accept_default():
    from posfair.cli.parsers import calibration_spec

    assert [calibration_spec(s) for s in ("default", "512,1,1.0")] == [Calibration(), Calibration(512, 1, 1.0)]


def test_txt_lines_end_at_newlines_only(tmp_path):
    from posfair.files.reading import read_texts

    (tmp_path / "in.txt").write_bytes("one\x0cwith a form feed\r\ntwo\u2028three\n\n".encode())
    assert read_texts(tmp_path / "in.txt") == (["one\x0cwith a form feed", "two\u2028three"], None)
    (tmp_path / "in.jsonl").write_bytes('{"text": "a\u2028b"}\n'.encode())
    assert read_texts(tmp_path / "in.jsonl") == (["a\u2028b"], None)
