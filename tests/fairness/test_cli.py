import pandas as pd
from typer.testing import CliRunner

from posfair.fairness.cli import app


def test_audit_cli_end_to_end(tmp_path, tiny_model_path, make_corpus):
    path, pooling = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "2", "3", "--mixed", "de:en",
         "--calibration", "8,0.5,1.0", "--docs", "12", "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    obs = pd.read_parquet(out / "observations.parquet")
    assert sorted(obs["n"].unique()) == [2, 3]
    assert set(obs["config"]) == {"[de, en, ..., en]"}
    assert set(obs["calibration"]) == {"stock", "B8-L0.5-a1"}
    assert (out / "report.html").exists() and "report:" in res.output
    # a re-run is answered from the cache (OUT/cache) and gives the same observations
    res2 = CliRunner().invoke(
        app,
        ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "2", "--n", "3", "--mixed", "de:en",
         "--calibration", "8,0.5,1.0", "--docs", "12", "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--out", str(out)],
    )  # fmt: skip
    assert res2.exit_code == 0, res2.output
    pd.testing.assert_frame_equal(obs, pd.read_parquet(out / "observations.parquet"))


def test_audit_cli_bad_input(tmp_path, make_corpus):
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    res = CliRunner().invoke(app, ["audit", "--corpus", str(corpus), "--langs", "en", "--mixed", "de", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "LEAD:LATER" in res.output
    res = CliRunner().invoke(app, ["audit", "--corpus", str(corpus), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "language configuration" in res.output
