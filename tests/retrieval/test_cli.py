import pandas as pd
from tests.retrieval.conftest import build_cli_benchmark
from typer.testing import CliRunner

from posfair.cli import app


def test_cli_build_and_retrieval(tmp_path):
    build_cli_benchmark(tmp_path)
    runner = CliRunner()
    assert (tmp_path / "bench" / "deu-Latn" / "all" / "qrels" / "test.parquet").exists()
    res = runner.invoke(
        app,
        [
            "retrieval",
            "--benchmark",
            str(tmp_path / "bench"),
            "--lang",
            "de",
            "--corpus-lang",
            "en",
            "--calibration",
            "16,0.5,0.5",
            "--out",
            str(tmp_path / "out"),
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    table = pd.read_csv(tmp_path / "out" / "table_groups.csv")
    assert table["setting"].tolist() == ["stock", "B16-L0.5-a0.5"]  # one name per setting, as in every output
    # the terminal's view (CliRunner output is not a terminal): plain aligned rows, one per setting, no box
    # drawing, nothing cut; the numbers are the CSV's
    lines = res.stdout.splitlines()
    assert not any(ch in res.stdout for ch in "─│┃━┏┓╇…")
    stock = next(ln for ln in lines if ln.startswith("stock "))
    calibrated = next(ln for ln in lines if ln.startswith("B16-L0.5-a0.5 "))
    for line, (_, r) in zip((stock, calibrated), table.iterrows(), strict=True):
        assert f"{r['nDCG@10']:.2f}" in line and f"{r['Harm']:.2f}" in line
    res = runner.invoke(app, ["retrieval", "--benchmark", "no-such-benchmark"])
    assert res.exit_code == 2 and res.stderr.startswith(
        "error: --benchmark no-such-benchmark: not an existing folder or file, and not a known benchmark"
    )
