"""A small table model with Markdown, CSV and LaTeX writers (atomic writes).

A :class:`Table` holds a DataFrame of already formatted cells (strings), an
optional row index of one or more levels (rendered as leading columns with
repeated labels blanked, like the paper's tables), a title and a caption.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from posfair.io import atomic_write_text

__all__ = ["Table", "to_markdown", "to_csv", "to_latex", "to_html", "write_table"]


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
        for idx, row in zip(df.index, df.itertuples(index=False)):
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


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(table: Table) -> str:
    header, body = table.rows()
    out = [f"**{table.title}**", ""] if table.title else []
    out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    out.append("|" + "|".join("---" for _ in header) + "|")
    out += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in body]
    if table.caption:
        out += ["", table.caption]
    return "\n".join(out) + "\n"


def to_csv(table: Table) -> str:
    header, _ = table.rows()
    df = table.frame
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for idx, row in zip(df.index, df.itertuples(index=False)):
        labels = [str(x) for x in (idx if isinstance(idx, tuple) else (idx,))] if len(header) > len(df.columns) else []
        w.writerow(labels + ["" if pd.isna(v) else str(v) for v in row])
    return buf.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "◊": r"$^{\diamond}$", "□": r"$^{\square}$", "•": r"$^{\bullet}$", "…": r"\ldots{}",
    "β": r"$\beta$", "σ": r"$\sigma$", "τ": r"$\tau$", "−": "-", "≥": r"$\geq$",
}  # fmt: skip


def latex_escape(s: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in s)


def to_latex(table: Table, label: str | None = None) -> str:
    """A ``table`` environment with booktabs rules (needs ``booktabs`` and ``amssymb``)."""
    header, body = table.rows()
    n_lead = len(header) - len(table.frame.columns)
    spec = "l" * n_lead + "r" * len(table.frame.columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
    lines.append(" & ".join(latex_escape(h) for h in header) + r" \\")
    lines.append(r"\midrule")
    for k, r in enumerate(body):
        if k and n_lead and r[0]:
            lines.append(r"\midrule")
        lines.append(" & ".join(latex_escape(c) for c in r) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    cap = " ".join(x for x in (table.title, table.caption) if x)
    if cap:
        lines.append(rf"\caption{{{latex_escape(cap)}}}")
    lines.append(rf"\label{{{label or 'tab:' + table.name}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_html(table: Table) -> str:
    """An HTML ``<table>`` fragment (escaped)."""
    from html import escape

    header, body = table.rows()
    out = ['<table class="coef">']
    if table.title:
        out.append(f"<caption>{escape(table.title)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr></thead><tbody>")
    n_lead = len(header) - len(table.frame.columns)
    for r in body:
        cls = ' class="group"' if n_lead and r[0] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    if table.caption:
        out.append(f'<p class="caption">{escape(table.caption)}</p>')
    return "\n".join(out)


def write_table(table: Table, directory: str | os.PathLike, stem: str | None = None) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>.tex`` atomically; return their paths."""
    d = Path(directory)
    stem = stem or table.name
    return {
        "md": atomic_write_text(d / f"{stem}.md", to_markdown(table)),
        "csv": atomic_write_text(d / f"{stem}.csv", to_csv(table)),
        "tex": atomic_write_text(d / f"{stem}.tex", to_latex(table)),
    }
