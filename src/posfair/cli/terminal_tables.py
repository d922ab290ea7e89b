"""The one way a command prints a table: plain text that reads at 80 columns and pipes cleanly.

A table that fits the width is printed as aligned columns under an underlined header (no
box drawing, so a log file or ``grep`` sees plain text); one that does not fit is printed as
one block per row, ``header: value`` per line, so no cell is cut or wrapped mid-word.  On a
terminal the width is the terminal's (or ``COLUMNS``); piped or redirected it is 80 columns, as a
terminal's default (:func:`posfair.cli.terminal.width`).  Tables are printed by :func:`posfair.cli.terminal.table`, which wraps titles and
captions at words.  The same rows are written as CSV / Markdown in the output folder by the
library (:func:`posfair.report.tables.write_table`): this is only the terminal's view.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["table_text", "plural"]


def plural(n: int, word: str, words: str | None = None) -> str:
    """``"1 shard"``, ``"2 shards"``: a count with its noun in the right number (``words``: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


#: a number (with a unit of up to 2 characters, e.g. "64%"), or a dash standing for a missing one ("-", "—")
_NUMBER = re.compile(r"^([-+−]?(\d[\d,]*\.?\d*|\.\d+|nan)(\s?\S{0,2})?|-|—)$")


def _is_numeric(column: Sequence[str]) -> bool:
    cells = [c for c in column if c.strip()]
    return bool(cells) and all(_NUMBER.match(c.strip()) for c in cells)


def _total(widths: Sequence[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def _stacked(header: str, room: int) -> list[str]:
    """``header``'s words over as few lines as fit ``room`` columns (a word longer than that on a line of its own)."""
    import textwrap

    return textwrap.wrap(header, max(room, 1), break_long_words=False, break_on_hyphens=False) or [header]


def table_text(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    caption: str | None = None,
    width: int | None = None,
    keys: int = 1,
) -> str:
    """The table as text: aligned columns when they fit ``width`` (None: no limit) -- a header of several words
    stacked over lines when that makes them fit --, else one block per row whose title is the first ``keys``
    cells and whose lines are ``header: value`` for the others."""
    header = [str(h) for h in header]
    rows = [[str(c) for c in r] for r in rows]
    numeric = [_is_numeric([r[i] for r in rows]) for i in range(len(header))]
    heads = [[h] for h in header]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    if width is not None and _total(widths) > width:  # stack each header's words over lines, as narrow as its cells
        cells = [max([0] + [len(r[i]) for r in rows]) for i in range(len(header))]
        heads = [_stacked(h, c) for h, c in zip(header, cells, strict=True)]
        widths = [max([c] + [len(x) for x in h]) for h, c in zip(heads, cells, strict=True)]
    out = [title] if title else []
    if width is None or _total(widths) <= width:

        def line(cells: Sequence[str]) -> str:
            parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True)]
            return "  ".join(parts).rstrip()

        depth = max(len(h) for h in heads)
        out += [line([([""] * (depth - len(h)) + h)[k] for h in heads]) for k in range(depth)]
        out += ["  ".join("-" * w for w in widths)]
        out += [line(r) for r in rows]
    else:
        label_width = max(len(h) for h in header[keys:]) if len(header) > keys else 0
        for r in rows:
            out.append("- " + "  ".join(f"{h}={c}" for h, c in zip(header[:keys], r[:keys], strict=True)))
            out += [f"    {h.ljust(label_width)}  {c}" for h, c in zip(header[keys:], r[keys:], strict=True)]
    if caption:
        out.append(caption)
    return "\n".join(out)
