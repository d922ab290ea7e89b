"""``--help`` at 80 columns breaks lines at white space only (issue 57 item 4.1).

The parser's formatter broke names and flags at their hyphens (``'bundled:all-`` / ``minilm-l6-v2'``,
``--max-doc-`` / ``tokens``, ``[default: posfair-`` / ``fit]``): for the root and every command, at
``COLUMNS=80`` and piped (no ``COLUMNS``: 80 columns as well), each option's flags and its help text with its
default appear in the output with every word whole, no line ends in a word cut at a hyphen, and no line is
over 80 columns unless it is one unbreakable token.  posfair's own wrapping (warnings, tables, progress lines)
keeps hyphenated words whole too.
"""

from __future__ import annotations

import itertools
import re

import pytest
import typer

from posfair.cli import app, terminal
from posfair.cli.app import COMMANDS

WIDTH = 80


def _command(name: str | None):
    root = typer.main.get_command(app)
    return root if name is None else root.commands[name]


def _flag_whole(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def check_help(text: str, name: str | None) -> None:
    """``text`` (the help of ``name``; None: the root) breaks lines at white space only and fits 80 columns."""
    lines = text.splitlines()
    cut = [f"{a!r} / {b!r}" for a, b in itertools.pairwise(lines) if re.search(r"\w-$", a.rstrip())]
    assert not cut, "a word cut at its hyphen:\n" + "\n".join(cut)
    too_long = [line for line in lines if len(line) > WIDTH and len(line.split()) > 1]
    assert not too_long, too_long
    command = _command(name)
    ctx = command.context_class(command, info_name=name or "posfair")
    flat = " ".join(text.split())
    for param in command.get_params(ctx):
        for flag in [*param.opts, *param.secondary_opts]:
            assert _flag_whole(flag, text), f"{flag} is not whole in the help of {name or 'posfair'}"
        record = param.get_help_record(ctx)
        if record is not None:  # the option's help and its [default: ...] as one text: every word whole
            assert " ".join(record[1].split()) in flat, record


@pytest.mark.parametrize("piped", [False, True], ids=["COLUMNS=80", "piped"])
@pytest.mark.parametrize("name", [None, *COMMANDS], ids=["posfair", *COMMANDS])
def test_help_breaks_lines_at_white_space_only(name, piped, monkeypatch):
    """The help as the ``posfair`` script prints it (the parser's own width: the terminal's, at most 80, less
    2; typer's CliRunner forces 80 instead, so the help is rendered here as the script renders it)."""
    if piped:
        monkeypatch.delenv("COLUMNS", raising=False)  # (pytest's captured stdout is no terminal: 80 columns)
    else:
        monkeypatch.setenv("COLUMNS", str(WIDTH))
    command = _command(name)
    parent = None if name is None else _command(None).context_class(_command(None), info_name="posfair")
    ctx = command.context_class(command, info_name=name or "posfair", parent=parent)
    check_help(command.get_help(ctx), name)


def test_the_script_prints_help_with_names_whole():
    """The ``posfair`` script itself, piped: ``fit --help`` keeps its default ``posfair-fit`` and the bundled
    model's name whole (both were cut at a hyphen)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    res = subprocess.run([sys.executable, "-m", "posfair.cli", "fit", "--help"], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    check_help(res.stdout, "fit")
    flat = " ".join(res.stdout.split())
    assert "[default: posfair-fit]" in flat and "'bundled:all-minilm-l6-v2'" in res.stdout, res.stdout


def test_posfairs_own_wrapping_keeps_hyphenated_words_whole():
    """Warnings, notes and progress lines (:func:`terminal.wrap`) and a table's stacked headers break at white
    space only: a model name, a flag, a setting's name stay whole however narrow the width."""
    words = ["'bundled:all-minilm-l6-v2'", "--max-doc-tokens", "B128-L0.5-a0.5", "posfair-fit", "held-out"]
    text = "warning: " + " ".join(f"see {w} and" for w in words)
    for columns in (12, 20, 30, WIDTH):
        lines = terminal.wrap(text, columns)
        assert " ".join(lines).split() == text.split(), lines  # each word on one line
        assert not [line for line in lines if line.rstrip().endswith("-")], lines
    from posfair.cli.terminal_tables import table_text

    shown = table_text("", ["n", "calibrated share-of-documents"], [["3", "1.0"]], width=12)
    assert "share-of-documents" in shown and not re.search(r"\w-\n", shown), shown
