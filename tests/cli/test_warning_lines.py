"""A command prints posfair's own warnings, one line each; another library's notices only with --debug."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import posfair
from posfair.cli.error_boundary import one_line_warnings
from posfair.store import DamagedShardWarning

INSIDE = str(Path(posfair.__file__).parent / "encoding" / "cache.py")
OUTSIDE = "/somewhere/site-packages/sentence_transformers/base/model.py"


def emit():
    warnings.warn_explicit("ST: `encode_multi_process` is deprecated", DeprecationWarning, OUTSIDE, 10)
    warnings.warn_explicit("a transformers notice\nover two lines", UserWarning, OUTSIDE, 11)
    warnings.warn_explicit("3 of 9 texts are longer than max_seq_length=256 tokens", UserWarning, INSIDE, 12)
    warnings.warn_explicit("shard part-x.arrow set aside", DamagedShardWarning, OUTSIDE, 13)


def test_only_posfairs_own_warnings_are_printed(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["posfair", "encode"])
    monkeypatch.delenv("POSFAIR_DEBUG", raising=False)
    with one_line_warnings():
        warnings.simplefilter("always")
        emit()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: 3 of 9 texts are longer than max_seq_length=256 tokens",
        "warning: shard part-x.arrow set aside",
    ]


def test_debug_shows_every_warning_on_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["posfair", "--debug", "encode"])
    with one_line_warnings():
        warnings.simplefilter("always")
        emit()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith("warning: ") for line in lines)
    assert "a transformers notice over two lines" in lines[1]
