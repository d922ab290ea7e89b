"""``posfair --help`` and ``posfair COMMAND --help`` wrapped at white space only.

The parser's help formatter wraps with :mod:`textwrap`'s defaults, which also break a line after a hyphen and
split a word longer than the line: at 80 columns ``'bundled:all-minilm-l6-v2'`` came out as ``'bundled:all-`` /
``minilm-l6-v2'``, ``--max-doc-tokens`` as ``--max-doc-`` / ``tokens``.  :class:`HelpFormatter` lays the help out
as the parser's does (usage, paragraphs, the two-column option list) but breaks lines only at white space; a
word longer than its column (a long path as a default) stays whole on a line of its own, as
:func:`posfair.cli.terminal.wrap` keeps it.  :class:`PosfairCommand` (every command) and
:class:`posfair.cli.error_boundary.PosfairGroup` (the ``posfair`` group) make their contexts with it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Iterator

from typer.core import TyperCommand, TyperGroup

__all__ = ["HelpFormatter", "HelpContext", "PosfairCommand", "wrap_help"]

# the parser's own classes (typer >= 0.2x vendors click; older typer uses click itself), taken from typer's group
_Context = TyperGroup.context_class
_Formatter = _Context.formatter_class


def _wrapper(width: int, first: str, rest: str) -> textwrap.TextWrapper:
    return textwrap.TextWrapper(
        max(width, 1),
        initial_indent=first,
        subsequent_indent=rest,
        replace_whitespace=False,
        break_on_hyphens=False,
        break_long_words=False,
    )


def _paragraphs(text: str) -> Iterator[tuple[int, bool, str]]:
    """The parser's paragraphs of a help text: (indent of its first line, kept as it is, text).  Paragraphs are
    separated by an empty line; one whose first line is ``\\b`` is kept line for line (not rewrapped)."""
    block: list[str] = []
    indent = 0

    def done() -> Iterator[tuple[int, bool, str]]:
        if block:
            raw = block[0].strip() == "\b"
            yield indent, raw, "\n".join(block[1:]) if raw else " ".join(block)
            block.clear()

    for line in text.splitlines():
        if not line:
            yield from done()
            continue
        if not block:
            indent = len(line) - len(line.lstrip())
            line = line.lstrip()
        block.append(line)
    yield from done()


def wrap_help(text: str, width: int, first: str = "", rest: str = "", paragraphs: bool = False) -> str:
    """``text`` wrapped to ``width`` at white space only (never after a hyphen, never inside a word), the first
    line indented by ``first``, the others by ``rest``; ``paragraphs``: each paragraph of the parser's help text
    (:func:`_paragraphs`) wrapped on its own, with its indent."""
    text = text.expandtabs()
    if not paragraphs:
        return _wrapper(width, first, rest).fill(text)
    out = []
    for indent, raw, body in _paragraphs(text):
        pad = " " * indent
        if raw:
            out.append("\n".join((first if i == 0 else rest) + pad + line for i, line in enumerate(body.splitlines())))
        else:
            out.append(_wrapper(width, first + pad, rest + pad).fill(body))
    return "\n\n".join(out)


class HelpFormatter(_Formatter):
    """The parser's help formatter, its usage line, paragraphs and option list wrapped by :func:`wrap_help`."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        prefix = "Usage: " if prefix is None else prefix
        usage = f"{prefix:>{self.current_indent}}{prog} "
        room = self.width - self.current_indent
        if not args:
            self.write(usage.rstrip(" ") + "\n")
            return
        if room >= len(usage) + 20:  # the arguments fit to the right of the prefix
            self.write(wrap_help(args, room, usage, " " * len(usage)))
        else:  # the prefix is too long: the arguments on the lines below it
            indent = " " * (max(self.current_indent, len(prefix)) + 4)
            self.write(usage + "\n" + wrap_help(args, room, indent, indent))
        self.write("\n")

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        self.write(wrap_help(text, self.width, indent, indent, paragraphs=True) + "\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = [tuple(r) + ("",) * (2 - len(r)) for r in rows]
        if any(len(r) != 2 for r in rows):
            raise TypeError("Expected two columns for definition list")
        first_col = min(max([len(r[0]) for r in rows] + [0]), col_max) + col_spacing
        margin = " " * (first_col + self.current_indent)
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            if not second:
                self.write("\n")
                continue
            self.write(" " * (first_col - len(first)) if len(first) <= first_col - col_spacing else "\n" + margin)
            lines = wrap_help(second, max(self.width - first_col - 2, 10), paragraphs=True).splitlines() or [""]
            self.write("\n".join([lines[0], *(f"{margin}{line}" if line else "" for line in lines[1:])]) + "\n")


class HelpContext(_Context):
    """The parser's context, its help laid out by :class:`HelpFormatter`."""

    formatter_class = HelpFormatter


class PosfairCommand(TyperCommand):
    """Every ``posfair`` command: its ``--help`` wrapped at white space only (:class:`HelpFormatter`)."""

    context_class = HelpContext
