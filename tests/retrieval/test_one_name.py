"""One name per setting in every output of `posfair retrieval` (terminal, CSV, JSON), a legend line for every
column, number columns right-aligned also where they hold a dash (issue 40 item 3)."""

from __future__ import annotations

import json

import pandas as pd
from tests.retrieval.conftest import build_cli_benchmark
from typer.testing import CliRunner

from posfair.cli import app
from posfair.cli.terminal_tables import table_text


def test_every_output_names_a_setting_one_way_and_every_column_is_explained(tmp_path):
    build_cli_benchmark(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["retrieval", "--benchmark", str(tmp_path / "bench"), "--lang", "de", "--corpus-lang",
                                   "en", "--calibration", "16,0.5,0.5", "--calibration", "512,1,1", "--late", "max",
                                   "--late-chunks", "16", "--out", str(out), "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0, res.output
    names = ["stock", "late-max (16-token windows)", "B512-Llast1-a1", "B16-L0.5-a0.5"]  # B512: no document is longer
    groups, buckets = pd.read_csv(out / "table_groups.csv"), pd.read_csv(out / "table_buckets.csv")
    assert groups["setting"].tolist() == buckets["setting"].tolist() == names
    runs = {json.loads(p.read_text())["setting"] for p in (out / "runs").glob("*.json")}
    assert runs == set(names)
    differences = pd.read_csv(out / "table_differences.csv")["setting"].tolist()
    assert differences == ["late-max (16-token windows)", "B16-L0.5-a0.5"]  # evaluated, not stock
    lines = res.stdout.splitlines()
    for name in names:  # the terminal's rows start with the same names: the groups, buckets, differences tables
        rows = 0 if name == "B512-Llast1-a1" else 2 + (name in differences)  # a no-op: said in one line, not as rows
        assert sum(line.startswith(name + "  ") for line in lines) == rows, name
    assert [line for line in lines if "B512-Llast1-a1" in line] == [next(x for x in lines if "change no document" in x)]
    for old in ("No calibration", "Late chunking", "B=16, a=", "dPSI", "section", "best"):
        assert old not in res.stdout, old
    # a legend line for every column: "<column>: ..." (the positional groups share one line)
    legend = [line for line in lines if ": " in line]
    for column in [*groups.columns, *buckets.columns]:
        if column.startswith("seg "):
            assert any(line.startswith("seg 1, seg 2, seg 3: ") for line in legend)
        elif column.startswith(("PSI Q", "ΔPSI Q")):
            assert any(line.startswith(("PSI Q1..Q4: ", "ΔPSI Qk: ")) for line in legend), column
        else:
            assert any(line.startswith(f"{column}: ") for line in legend), column
    # stock's dashes (no change from itself) sit under the numbers' last digits
    head = next(line for line in lines if line.startswith("setting") and "ΔnDCG@10" in line)
    stock = [line for line in lines if line.startswith("stock ")][1]  # its row in the buckets table
    assert stock[head.index("ΔnDCG@10") + len("ΔnDCG@10") - 1] == "-"


def test_a_column_of_numbers_and_dashes_is_right_aligned():
    text = table_text("", ["setting", "x"], [["a", "12.50"], ["b", "-"], ["c", "—"]])
    rows = text.splitlines()[2:]
    assert [len(r) for r in rows] == [len(rows[0])] * 3 and rows[1].endswith(" -") and rows[2].endswith(" —")
