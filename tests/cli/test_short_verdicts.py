"""`posfair sweep` says a no-op calibration once and explains only what it ran (issue 49 item 2); `tune`'s short
verdict is checked in tests/tuning/test_tune_terminal.py."""

from __future__ import annotations

import pandas as pd
from tests.retrieval.conftest import build_cli_benchmark
from typer.testing import CliRunner

from posfair.cli import app


def test_a_sweep_says_its_no_op_settings_in_one_line_and_its_legend_names_only_what_it_ran(tmp_path, tiny_model_path):
    build_cli_benchmark(tmp_path)
    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "out"
    args = ["sweep", "--benchmark", str(tmp_path / "bench"), "--lang", "de", "--corpus-lang", "en", "--model",
            str(path), "--device", "cpu", "--baskets", "16,512", "--strengths", "0.5", "--out", str(out)]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    noop = ["B512-Llast1-a0.5", "B512-L0.5-a0.5"]  # every document is shorter than 512 tokens
    table = pd.read_csv(out / "table_groups.csv")
    assert set(noop) <= set(table["setting"])  # the files keep their rows
    lines = r.output.splitlines()
    for setting in noop:  # on the terminal: named once, in the one no-op line
        assert [line for line in lines if setting in line] == [
            next(line for line in lines if "change no document" in line)
        ]
    assert sum("change no document" in line for line in lines) == 1
    legend = " ".join(r.stdout.split())
    assert "SEA" not in legend and "late chunking" not in legend  # the sweep ran neither
    assert "(— for stock)" in legend
