"""``posfair retrieval`` checks the shared store like every command: other settings are refused with one line."""

from __future__ import annotations

import json

from tests.retrieval.conftest import build_cli_benchmark
from typer.testing import CliRunner

from posfair.cli import app


def test_retrieval_refuses_a_store_of_other_settings(tmp_path):
    build_cli_benchmark(tmp_path)
    runner = CliRunner()
    args = ["retrieval", "--benchmark", str(tmp_path / "bench"), "--lang", "en", "--no-stock", "--calibration", "16,0.5,0.5",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--device", "cpu"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    manifests = sorted((tmp_path / "cache").glob("*/manifest.json"))
    assert manifests
    first = json.loads(manifests[0].read_text())
    manifests[0].write_text(json.dumps({**first, "posfair_version": "0.0.1"}))
    res = runner.invoke(
        app, [a if a != str(tmp_path / "out") else str(tmp_path / "out2") for a in args]
    )  # results not yet in OUT
    assert res.exit_code == 2
    assert res.stderr.splitlines()[-1] == (
        f"error: store {manifests[0].parent} was made with other settings (posfair_version: the store has '0.0.1', this run has "
        f"'{first['posfair_version']}'): refusing to mix them; use another store folder, or delete {manifests[0].parent} to recompute it"
    )
