"""``posfair encode``: inputs, outputs, calibration options, resume, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from posfair import Calibration
from posfair.cli import app

TEXTS = ["Debian is a free operating system. " * 6, "How do I install a package?", "The installer runs in many languages."]


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
    assert not (tmp_path / "out.npy.cache").exists()  # temporary cache removed after success


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
    shards = sorted((tmp_path / "cache").rglob("part-*.npz"))
    assert shards
    assert run(*args).exit_code == 0
    assert sorted((tmp_path / "cache").rglob("part-*.npz")) == shards  # nothing recomputed


@pytest.mark.parametrize(
    "name,content,extra,message",
    [
        ("in.jsonl", '{"text": "ok"}\n{"other": 1}\n', (), "no 'text' field"),
        ("in.jsonl", '{"text": "ok"}\n{broken\n', (), "line 2 is not valid JSON"),
        ("in.csv", "a,b\n", (), "unsupported input type"),
        ("in.jsonl", '{"text": "ok"}\n{"text": "  "}\n', (), "empty texts"),
        ("in.txt", "fine\n", ("--strength", "2"), "strength"),
        ("in.txt", "fine\n", ("--layers", "9+10"), "out of range"),
    ],
)
def test_bad_input_is_named(tmp_path, name, content, extra, message):
    (tmp_path / name).write_text(content)
    r = run("encode", "-i", tmp_path / name, "-o", tmp_path / "o.npy", *extra)
    assert r.exit_code != 0
    text = r.output + (str(r.exception) if r.exception else "")
    assert message in " ".join(text.replace("│", " ").split())  # rich wraps the error panel


def test_every_command_is_mounted():
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"encode", "audit", "demo", "attention", "retrieval", "sweep", "build-benchmark", "tune", "embed"} <= names


def test_calibration_specs_accept_default():
    from posfair.cliutil import calibrations_option

    assert calibrations_option(["default", "512,1,1.0"]) == [Calibration(), Calibration(512, 1, 1.0)]
