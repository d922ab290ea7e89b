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


#: a calibration named as outputs name settings (``B128-L0.5-a0.5``, ``B64-Llast1-a1``), or as the command line
#: spells one (``64,1,1``, ``128,0.5,0.5``)
SETTING = re.compile(r"\bB\d+-L[\w.+]+-a\d+(?:\.\d+)?")
SPEC = re.compile(r"(?<![\w.,])\d+,\d+(?:\.\d+)?,\d+(?:\.\d+)?(?![\w.,])")
#: a configuration named as a list of languages (``[de, en, en]``, ``[de, en, ..., en]``)
CONFIGURATION = re.compile(r"\[[a-z]{2}(?:, (?:[a-z]{2}|\.\.\.))+\]")


def test_a_run_writes_one_name_for_each_setting_and_configuration_everywhere(tmp_path, tiny_model_path, monkeypatch):
    """Issue 49 item 3, "a test that collects the names a run writes everywhere and finds one per thing": an audit
    of a mixed configuration with two calibrations (the last layer, ``64,1,1``: the "1" versus "1.0" trap), its
    terminal, every file it writes (Markdown, HTML, LaTeX, CSV, JSON, the observations), the texts of every figure
    it draws and its file names.  Each calibration is named by ``Calibration.label()`` and nothing else, the
    configuration by ``config_label`` (files: the instance's key ``n3-de-en`` in a name, the configuration's key
    in the data); no other spelling of either, and "calibrated share" one way where a person reads it."""
    import pandas as pd
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from posfair import Calibration
    from posfair.fairness.documents import LanguageConfig, config_label, instance_label

    drawn: list[str] = []
    savefig = Figure.savefig

    def recording(fig, *args, **kwargs):
        drawn.extend(t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "audit-out"
    specs = ["default", "64,1,1"]
    r = CliRunner().invoke(app, ["audit", "--model", str(path), "--lang", "en", "--mixed", "de:en", "--n", "3",
                                 "--docs", "12", "--calibration", specs[0], "--calibration", specs[1],
                                 "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    labels = {Calibration.parse(s).label() for s in specs}  # the one naming function of a setting
    config = LanguageConfig.parse("de:en")
    name, instance = config_label(config.name, 3), instance_label(3, config.name)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    read = {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in files
            if p.suffix in (".md", ".html", ".tex", ".txt")}  # fmt: skip
    read |= {"terminal": r.stdout + r.stderr, "figures": "\n".join(drawn)}
    # the report's run parameters are the run's settings as recorded (data: the configuration by its key)
    read["report.html"], parameters = re.split(r'<section id="s\d+-run-parameters">', read["report.html"])
    data = {
        p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in files if p.suffix in (".csv", ".json")
    }
    for p in files:
        if p.suffix == ".parquet":
            frame = pd.read_parquet(p)
            data[p.name] = "\n".join(str(v) for c in frame.select_dtypes(exclude="number") for v in frame[c].unique())
    data["file names"] = "\n".join(p.relative_to(out).as_posix() for p in files)
    data["report.html: run parameters"] = parameters
    assert drawn and any(k.endswith(".md") for k in read) and any(k.endswith(".csv") for k in data)

    # a setting: its label, wherever it is named (a person reads it or a program does), never its spec or the like
    for where, text in (read | data).items():
        assert set(SETTING.findall(text)) <= labels, (where, set(SETTING.findall(text)) - labels)
    for where, text in read.items():
        assert not SPEC.findall(text), (where, SPEC.findall(text))
    for label in labels:
        for where in ("terminal", "figures", "report.html"):
            assert label in read[where], (label, where)
        assert any(label in text for where, text in data.items() if where.endswith(".csv")), label

    # the configuration: [de, en, en] where a person reads it (instances n=3 [de, en, en]), its key only in data
    for where, text in read.items():
        assert set(CONFIGURATION.findall(text)) <= {name}, (where, set(CONFIGURATION.findall(text)))
        for other in (config.key, instance.replace(" ", ""), "n3-de-en", "first, then", "German first", "de:en",
                      "mixed de", "calibrated_share"):  # fmt: skip
            assert other not in text, (where, other)
    for where in ("terminal", "figures", "report.html"):
        assert name in read[where], where
    assert "calibrated share" in read["terminal"] and "calibrated share" in read["report.html"]
    assert instance in read["terminal"] and instance in read["report.html"]
    for where, text in data.items():
        assert set(CONFIGURATION.findall(text)) <= {name, config.name}, (where, set(CONFIGURATION.findall(text)))
        assert "first, then" not in text and "German first" not in text, where
