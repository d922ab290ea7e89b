import pandas as pd
from typer.testing import CliRunner

from posfair.cli import app


def test_audit_cli_end_to_end(tmp_path, tiny_model_path, make_corpus):
    path, pooling = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "2,3", "--mixed", "de:en",
         "--calibration", "8,0.5,1.0", "--docs", "12", "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    obs = pd.read_parquet(out / "observations.parquet")
    assert sorted(obs["n"].unique()) == [2, 3]
    assert set(obs["config"]) == {"[de, en, ..., en]"}
    assert set(obs["calibration"]) == {"stock", "B8-L0.5-a1"}
    assert (out / "report.html").exists() and "report:" in res.output
    # the summary says how many documents the calibration changed (mean pooling: content = all tokens,
    # calibrated when longer than one basket of 8)
    docs = obs[(obs.calibration == "B8-L0.5-a1") & (obs.setting == "main")].drop_duplicates("doc_id")
    done = int((docs["doc_tokens"] > 8).sum())
    assert (
        f"calibrated share of B8-L0.5-a1: {done / len(docs):.3f} ({done} of {len(docs)} documents calibrated)"
        in " ".join(res.output.split())
    )
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
    res = CliRunner().invoke(
        app, ["audit", "--corpus", str(corpus), "--langs", "en", "--mixed", "de", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2 and "LEAD:LATER" in res.output
    # no language given: English, as every other command (this corpus's segments are too short for n = 3)
    res = CliRunner().invoke(app, ["audit", "--corpus", str(corpus), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "instance (n=3, en)" in res.output


def test_inference_option_errors_before_any_work(tmp_path):
    out = tmp_path / "o"
    missing = str(tmp_path / "no-such-corpus.parquet")  # never opened: the options are checked first
    cases = [
        (["--inference", "nonsense"], "--inference nonsense: must be one of cluster, wild; got 'nonsense'"),
        (
            ["--inference", "wild", "--bootstrap-weights", "mammen"],
            "--bootstrap-weights mammen: must be one of webb, rademacher; got 'mammen'",
        ),
        (["--inference", "wild", "--bootstrap-draws", "10"], "--bootstrap-draws 10: must be >= 99; got 10"),
        (["--bootstrap-draws", "999"], "--bootstrap-draws applies only to --inference wild"),
    ]
    for extra, message in cases:
        res = CliRunner().invoke(app, ["audit", "--corpus", missing, "--langs", "en", "--out", str(out), *extra])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert lines == [f"error: {message}"] or (len(lines) == 1 and lines[0].startswith(f"error: {message}")), (
            res.output
        )
        assert not out.exists()
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--inference", "bogus"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "error: --inference bogus: must be one of cluster, wild; got 'bogus'"
    ]
    assert not out.exists()


def test_audit_cli_wild_inference_recorded(tmp_path, tiny_model_path, make_corpus):
    import json

    path, _ = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "2", "--langs", "en", "--docs", "12",
         "--min-segment-tokens", "1", "--max-segment-tokens", "60", "--no-control", "--out", str(out),
         "--inference", "wild", "--bootstrap-draws", "199", "--bootstrap-weights", "rademacher", "--bootstrap-seed", "5"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert (
        settings["inference"],
        settings["bootstrap_draws"],
        settings["bootstrap_weights"],
        settings["bootstrap_seed"],
    ) == (
        "wild",
        199,
        "rademacher",
        5,
    )
    coefs = pd.read_csv(out / "coefficients.csv")
    # the default clustering, conservative: 6 sets of 2 of 8 topics share topics, so each coefficient's interval and
    # bootstrap use the wider of two-way and components, with its G; 2^G < 199: every sign vector
    G = int(coefs["clusters"].min())
    assert G <= pd.read_parquet(out / "observations.parquet")["set_id"].nunique() < 20
    for r in coefs.itertuples():
        assert r.inference == f"wild WCR11 conservative rademacher all 2^{r.clusters}"
        assert r.cluster_by.startswith(("components (", "set+topic (")) and r.p >= 2 / 2**r.clusters - 1e-12
    # the few-clusters warning is a line of the CLI output and of the report
    assert f"warning: 1 of 1 instances rest on fewer than 20 clusters (G) -- n=2 en: G={G}" in " ".join(
        res.output.split()
    )
    assert "Few clusters:" in (out / "report.html").read_text()
    detail = (out / "tables" / "sigma_stock_main_detail.csv").read_text()
    assert detail.splitlines()[0] == "n,configuration,coefficient,estimate,SE,t,p,mark,G,clusters,inference"
