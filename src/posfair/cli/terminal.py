"""The one writer of every line a command prints: results, notes, warnings, errors, legends, tables, progress labels.

Every line goes through :func:`say` (stdout) or :func:`say` with ``err=True`` (stderr), which wraps it at
words to the width (:func:`width`): ``COLUMNS`` when set, else the terminal's width when the stream is a
terminal, else 80 (piped or redirected: a log reads as an 80-column terminal shows it).  One kind of line is
never wrapped where no width was given (piped or redirected without ``COLUMNS``): an ``error:`` line, which
stays one line for a log, ``grep`` or a script reading it.  A wrapped line continues on lines indented two
spaces more than its first; a word longer than the width (a long path) stays whole on a line of its own, never
split.  Tables (:func:`table`) print as aligned columns when they fit the width, else one block per row
(:mod:`posfair.cli.terminal_tables`); progress bars show a label cut at a word to a short column
(:func:`short_label`).  No markup is read in any text: what is passed is what is printed.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import TextIO

__all__ = [
    "PLAIN_WIDTH",
    "given_width",
    "width",
    "wrap",
    "say",
    "warn",
    "error",
    "table",
    "frame",
    "short_label",
    "Writer",
]


#: the width where neither ``COLUMNS`` nor a terminal gives one (piped or redirected): a terminal's default
PLAIN_WIDTH = 80


def given_width(stream: TextIO | None = None) -> int | None:
    """The width ``stream`` (default stdout) was given: ``COLUMNS`` when set to a positive number, else the
    terminal's columns when ``stream`` is a terminal, else None (piped or redirected without ``COLUMNS``)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or PLAIN_WIDTH
    except (AttributeError, OSError, ValueError):
        pass
    return None


def width(stream: TextIO | None = None) -> int:
    """The width lines are wrapped to on ``stream`` (default stdout): :func:`given_width`, else
    :data:`PLAIN_WIDTH` (80)."""
    given = given_width(stream)
    return PLAIN_WIDTH if given is None else given


def wrap(text: str, columns: int | None) -> list[str]:
    """``text``'s lines, each wrapped at words to ``columns`` (None: as they are); a continuation line is
    indented two spaces more than the line it continues; a word longer than ``columns`` is never split."""
    out: list[str] = []
    for line in str(text).split("\n"):
        line = line.rstrip()
        if columns is None or len(line) <= columns:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line,
            columns,
            subsequent_indent=lead + "  ",
            break_long_words=False,
            break_on_hyphens=False,
            replace_whitespace=False,
        ) or [line]
    return out


def say(text: str = "", *, err: bool = False) -> None:
    """Print ``text`` on stdout (``err``: stderr), every line wrapped at words to the stream's width; an
    ``error:`` line stays whole where no width was given (:func:`given_width`: piped without ``COLUMNS``)."""
    stream = sys.stderr if err else sys.stdout
    if err:
        sys.stdout.flush()  # what was said before comes before
    whole = str(text).startswith("error: ") and given_width(stream) is None
    stream.write("\n".join(wrap(text, None if whole else width(stream))) + "\n")
    stream.flush()


def warn(message: str) -> None:
    """``warning: <message>`` on stderr (the message on one logical line, wrapped at words)."""
    say(f"warning: {_one_line(message)}", err=True)


def error(message: str) -> None:
    """``error: <message>`` on stderr (the message on one logical line, wrapped at words to a given width;
    piped or redirected without ``COLUMNS``: one line, whole)."""
    say(f"error: {_one_line(message)}", err=True)


def _one_line(message: str) -> str:
    """A multi-line message joined with spaces (as :func:`posfair.cli.error_boundary.one_line`)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def table(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    caption: str | None = None,
    keys: int = 1,
) -> None:
    """A table on stdout: aligned columns that fit the width, else one block per row (see
    :func:`posfair.cli.terminal_tables.table_text`); title and caption wrapped at words."""
    from posfair.cli.terminal_tables import table_text

    say(table_text(title, header, rows, caption=caption, width=width(), keys=keys))


def frame(title: str, data, *, caption: str | None = None) -> None:
    """A pandas frame as :func:`table`: its named index levels are the leading (key) columns."""
    named = [str(n) if n is not None else "" for n in data.index.names]
    flat = data.reset_index() if any(named) else data
    keys = len(named) if any(named) else 1
    header = [str(c) for c in flat.columns]
    rows = [["" if v is None else str(v) for v in r] for r in flat.itertuples(index=False)]
    table(title, header, rows, caption=caption, keys=keys)


def short_label(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ``…`` marking the cut (a progress bar's label).

    The end of a label is what tells its bars apart (``n=3 [de, en, en] stock`` and ``n=3 [de, en, en]
    B128-L0.5-a0.5``, ``...: queries (stock)``): its last word, or the parenthesis it ends with, stays whole and
    the middle is cut at a word (``n=3 [de, en… stock``) when that leaves a few characters of the beginning;
    else the label is cut at a word from its end (``bench-de: documents…``)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head, tail = _head_and_tail(text)
    room = limit - len(tail) - 1  # the beginning, with its "…", beside the end (the beginning is longer than that)
    if tail and room > _HEAD_MIN:
        return f"{_cut(head, room)} {tail}"
    return _cut(text, limit)


#: the fewest characters of a label's beginning kept beside its end (else the end is what is cut)
_HEAD_MIN = 4


def _head_and_tail(text: str) -> tuple[str, str]:
    """``text`` as (beginning, end): the end is the parenthesis it ends with, else its last word ("" if one word)."""
    if text.endswith(")") and " (" in text:
        start = text.rindex(" (")
        if "(" not in text[start + 2 :] and ")" not in text[start + 2 : -1]:
            return text[:start], text[start + 1 :]
    head, _, tail = text.rpartition(" ")
    if not head or "(" in tail or ")" in tail:
        return text, ""  # one word, or the last word of a parenthesis: no end of its own
    return head, tail


def _cut(text: str, limit: int) -> str:
    """``text`` (longer than ``limit``) cut at a word to at most ``limit`` characters, ``…`` marking the cut."""
    cut = text[: limit - 1].rsplit(" ", 1)[0] if " " in text[: limit - 1] else text[: limit - 1]
    return cut.rstrip(" ,:;(·[-") + "…"


class Writer:
    """What :func:`posfair.cli.terminal_progress.console` gives: ``print(text)`` through :func:`say` (keyword
    arguments of rich's ``Console.print`` are accepted and ignored: no markup is read), with ``width`` and
    ``is_terminal`` for code that asks."""

    def __init__(self, err: bool = False) -> None:
        self.err = err

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self.err else sys.stdout

    @property
    def width(self) -> int:
        return width(self.stream)

    @property
    def is_terminal(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def print(self, *objects, **_ignored) -> None:
        say(" ".join(str(o) for o in objects), err=self.err)
