"""One thing, one name in every output of a run (issue 49 item 3): a mixed-language configuration is ``[de, en, en]``
(n = 3) in the terminal's table, its sampling line, the progress, the few-clusters warning and the report; an
instance is ``n=3 [de, en, en]``, never its file-name key ``n3-de-en``."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from posfair.cli import app


def test_an_audits_mixed_configuration_has_one_name_everywhere(tmp_path, tiny_model_path):
    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "audit-out"
    r = CliRunner().invoke(app, ["audit", "--model", str(path), "--lang", "en", "--mixed", "de:en", "--n", "3",
                                 "--docs", "12", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    said = r.stdout + r.stderr
    assert "n3-de-en" not in said and "first, then" not in said
    assert re.search(r"^n=3 \[de, en, en\]: \d+ documents from", r.stdout, re.M), r.stdout  # the sampling line
    assert re.search(r"^3\s+\[de, en, en\]\s", r.stdout, re.M), r.stdout  # the table's row
    assert "n=3 [de, en, en] stock:" in r.stderr  # the progress line (piped: one line per bar)
    report = (out / "report.html").read_text()
    assert "[de, en, en]" in report and "first, then" not in report and "n3-de-en" not in report


def test_the_share_of_documents_calibrated_has_one_spelling_in_what_a_person_reads(tmp_path, tiny_model_path):
    """ "calibrated share" in the terminal, the tables and the reports; ``calibrated_share`` only as the data's field
    (observations, JSON records, metric names)."""
    from tests.retrieval.conftest import build_cli_benchmark

    build_cli_benchmark(tmp_path)
    path, _ = tiny_model_path("bert-mean")
    runner = CliRunner()
    retrieval = runner.invoke(app, ["retrieval", "--benchmark", str(tmp_path / "bench"), "--lang", "de",
                                    "--corpus-lang", "en", "--model", str(path), "--calibration", "16,0.5,0.5",
                                    "--out", str(tmp_path / "r")])  # fmt: skip
    attention = runner.invoke(app, ["attention", "--model", str(path), "--calibration", "default", "--docs", "4",
                                    "--out", str(tmp_path / "a")])  # fmt: skip
    for r in (retrieval, attention):
        assert r.exit_code == 0, r.output
        assert "calibrated share" in r.stdout and "calibrated_share" not in r.output
    for page in (tmp_path / "a" / "attention.html", tmp_path / "r" / "table_groups.md"):
        text = page.read_text()
        assert "calibrated share" in text and "calibrated_share" not in text, page
