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
