"""A small table model with Markdown, CSV, LaTeX and HTML writers (atomic writes).

A :class:`Table` holds a DataFrame of already formatted cells (strings), an
optional row index of one or more levels (rendered as leading columns with
repeated labels blanked, like the paper's tables), a title and a caption.

The writers lay out :meth:`Table.rows` and leave the rendering to pandas:
Markdown through :meth:`pandas.DataFrame.to_markdown` (tabulate's pipe tables,
numbers kept as formatted), LaTeX through :meth:`pandas.io.formats.style.Styler.to_latex`
(booktabs rules), HTML through the ``table.html.j2`` template.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from posfair.files.atomic import atomic_write_text
from posfair.report.html import render_fragment

__all__ = ["Table", "to_markdown", "to_csv", "to_latex", "to_html", "shared_caption", "write_table", "latex_escape"]


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    caption: str = ""
    name: str = "table"

    def rows(self) -> tuple[list[str], list[list[str]]]:
        """Header and body rows; index levels become leading columns, repeated labels blanked."""
        df = self.frame
        index_names = [str(n) if n is not None else "" for n in (df.index.names or [])]
        has_index = not (len(index_names) == 1 and index_names[0] == "" and isinstance(df.index, pd.RangeIndex))
        header = (index_names if has_index else []) + [str(c) for c in df.columns]
        body, prev = [], None
        for idx, row in zip(df.index, df.itertuples(index=False), strict=True):
            lead: list[str] = []
            if has_index:
                labels = [str(x) for x in (idx if isinstance(idx, tuple) else (idx,))]
                lead = [
                    "" if prev is not None and labels[: k + 1] == prev[: k + 1] and k < len(labels) - 1 else lab
                    for k, lab in enumerate(labels)
                ]
                prev = labels
            body.append(lead + ["" if pd.isna(v) else str(v) for v in row])
        return header, body

    @property
    def n_lead(self) -> int:
        """The number of leading (index) columns in :meth:`rows`."""
        header, _ = self.rows()
        return len(header) - len(self.frame.columns)


def _layout(table: Table) -> tuple[pd.DataFrame, int]:
    """:meth:`Table.rows` as a frame with positional column labels (headers may repeat), and the leading columns."""
    header, body = table.rows()
    frame = pd.DataFrame(body, columns=range(len(header)), dtype=object)
    return frame, len(header) - len(table.frame.columns)


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(table: Table) -> str:
    """A pipe table (index columns left-aligned, cells right-aligned) under the bold title, the caption below."""
    header, _ = table.rows()
    frame, n_lead = _layout(table)
    out = [f"**{table.title}**", ""] if table.title else []
    if header:
        out.append(
            frame.map(_md_escape).to_markdown(
                index=False,
                headers=[_md_escape(h) for h in header],
                tablefmt="pipe",
                disable_numparse=True,  # the cells are formatted already: "0.000" stays "0.000"
                colalign=["left"] * n_lead + ["right"] * (len(header) - n_lead),
            )
        )
    if table.caption:
        out += ["", table.caption]
    return "\n".join(out) + "\n"


def to_csv(table: Table) -> str:
    """Every index label repeated on every row (a CSV is read by programs, not people)."""
    header, _ = table.rows()
    df = table.frame
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for idx, row in zip(df.index, df.itertuples(index=False), strict=True):
        labels = [str(x) for x in (idx if isinstance(idx, tuple) else (idx,))] if len(header) > len(df.columns) else []
        w.writerow(labels + ["" if pd.isna(v) else str(v) for v in row])
    return buf.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "◊": r"$^{\diamond}$",
    "□": r"$^{\square}$",
    "•": r"$^{\bullet}$",
    "…": r"\ldots{}",
    "β": r"$\beta$",
    "σ": r"$\sigma$",
    "τ": r"$\tau$",
    "−": "-",
    "≥": r"$\geq$",
}


def latex_escape(s: str) -> str:
    """LaTeX specials escaped, and the marks and Greek letters of posfair's tables as math (needs ``amssymb``)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(s))


_ROW_END = re.compile(r"\\\\\s*$")


def to_latex(table: Table, label: str | None = None) -> str:
    """A ``table`` environment with booktabs rules (needs ``booktabs`` and ``amssymb``).

    Index columns are left-aligned, cells right-aligned; a ``\\midrule`` separates the groups
    of the first index level (where its label is not blanked).
    """
    header, body = table.rows()
    frame, n_lead = _layout(table)
    cap = " ".join(x for x in (table.title, table.caption) if x)
    styler = frame.style.hide(axis="index").format(latex_escape).format_index(lambda i: latex_escape(header[i]), axis=1)
    tex = styler.to_latex(
        column_format="l" * n_lead + "r" * (len(header) - n_lead),
        position="t",
        position_float="centering",
        hrules=True,
        caption=latex_escape(cap) if cap else None,
        label=label or f"tab:{table.name}",
    )
    groups = [k for k, r in enumerate(body) if k and n_lead and r[0]]
    if not groups:
        return tex
    # Styler draws rules only at the top, under the header and at the bottom; the group rules go in
    # before the body rows that start a group (one line per row, after the header's \midrule)
    lines = tex.splitlines()
    first = lines.index(r"\midrule") + 1
    rows = [i for i in range(first, len(lines)) if _ROW_END.search(lines[i])][: len(body)]
    if len(rows) != len(body):
        raise RuntimeError(f"Styler.to_latex wrote {len(rows)} body rows for {len(body)}")
    for k in reversed(groups):
        lines.insert(rows[k], r"\midrule")
    return "\n".join(lines) + "\n"


def to_html(table: Table, caption: str | None = None) -> str:
    """An HTML ``<table>`` fragment (escaped) under its title, in a box that scrolls sideways rather than run past
    the page; the first row of each group is marked for a rule.  Column names are read by people here:
    ``topics_available`` is headed "topics available" (the CSV and Markdown keep the names).  ``caption``: what
    to print under the table instead of the table's own (e.g. its caption less what the page says once)."""
    header, body = table.rows()
    return render_fragment(
        "table.html.j2",
        title=table.title,
        caption=table.caption if caption is None else caption,
        header=[h.replace("_", " ") for h in header],
        body=body,
        n_lead=table.n_lead,
    )


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def shared_caption(captions: list[str], among: list[bool] | None = None) -> tuple[str, list[str]]:
    """The sentences every caption has (said once, above the tables), and each caption without them, in order:
    a page of tables of one kind need not repeat its 60-word method note under every table.  ``among``: which
    captions decide what is shared (e.g. the tables shown, not those folded away); every caption loses it."""
    split = [_SENTENCE_END.split(c.strip()) if c.strip() else [] for c in captions]
    deciding = [x for x, keep in zip(split, among or [True] * len(split), strict=True) if keep]
    if len(deciding) < 2 or not all(deciding):
        return "", list(captions)
    common = [x for x in deciding[0] if all(x in other for other in deciding[1:])]
    rest = [" ".join(x for x in sentences if x not in common) for sentences in split]
    return " ".join(common), rest


def write_table(table: Table, directory: str | os.PathLike, stem: str | None = None) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>.tex`` atomically; return their paths."""
    d = Path(directory)
    stem = stem or table.name
    return {
        "md": atomic_write_text(d / f"{stem}.md", to_markdown(table)),
        "csv": atomic_write_text(d / f"{stem}.csv", to_csv(table)),
        "tex": atomic_write_text(d / f"{stem}.tex", to_latex(table)),
    }
