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
    assert table["setting"].tolist() == ["No calibration", "B=16, a=0.5"]
    res = runner.invoke(app, ["retrieval", "--benchmark", "no-such-benchmark"])
    assert res.exit_code == 2 and res.stderr.startswith(
        "error: --benchmark no-such-benchmark: not an existing folder or file, and not a known benchmark"
    )
