"""An audit rerun into its old folder leaves no table of the earlier run beside the new ones (issue 38, item 3)."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from posfair.cli import app
from posfair.files.run_folder import MANIFEST


def _audit(model, corpus, out, *extra):
    args = ["audit", "--model", str(model), "--corpus", str(corpus), "--n", "2", "--docs", "12",
            "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--no-control", "--out", str(out), *extra]  # fmt: skip
    return CliRunner().invoke(app, args)


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_a_rerun_with_other_calibrations_and_languages_removes_the_earlier_tables(
    tmp_path, tiny_model_path, make_corpus
):
    model, _ = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    out = tmp_path / "X"
    first = _audit(model, corpus, out, "--calibration", "16,0.5,1", "--mixed", "de:en")
    assert first.exit_code == 0, first.output
    old_tables = [f for f in _files(out) if f.startswith("tables/") and "B16" in f]
    assert old_tables  # the first run's per-calibration tables
    (out / "notes.txt").write_text("my notes")
    second = _audit(model, corpus, out, "--calibration", "32,0.5,1", "--langs", "en")
    assert second.exit_code == 0, second.output
    files = _files(out)
    assert not [f for f in files if "B16" in f]  # nothing of the first run's calibration is left
    manifest = json.loads((out / MANIFEST).read_text())
    listed = set(manifest["files"])
    # every file of the folder is this run's (listed), the cache (state), the manifest or the user's own notes
    assert {f for f in files if not f.startswith("cache/")} == listed | {MANIFEST, "notes.txt"}
    assert (out / "notes.txt").read_text() == "my notes"
    said = " ".join(second.stderr.split())
    # (the corpus as read differs too: only its English rows are loaded for --langs en)
    assert (
        "replacing the results of an earlier audit made from other inputs (changed: calibrations, corpus, settings)"
        in said
    )
    assert "1 file was not written by this audit and is kept" in said and "notes.txt" in said
    # the observations say the same: only the new calibration
    assert set(pd.read_parquet(out / "observations.parquet")["calibration"]) == {"stock", "B32-L0.5-a1"}
