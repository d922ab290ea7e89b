"""The document families' findings as tables, a report section and ``families.json``.

The numbers are :mod:`posfair.fairness.families`' (:func:`~posfair.fairness.families.family_findings`,
:func:`~posfair.fairness.families.heterogeneity`); this module only renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from posfair.fairness.documents import config_label
from posfair.fairness.experiment import STOCK_LABEL
from posfair.fairness.families import families_of, heterogeneity
from posfair.files.atomic import atomic_write_json
from posfair.report.html import Section, render_string
from posfair.report.tables import Table, to_html, write_table

if TYPE_CHECKING:
    from posfair.fairness.findings import AuditFindings

__all__ = [
    "FAMILY_CAPTION",
    "HETEROGENEITY_CAPTION",
    "family_table",
    "heterogeneity_table",
    "families_json",
    "family_tables",
    "family_section",
    "save_families",
]


def _ci(row, q: str, digits: int = 3, percent: bool = False) -> str:
    est, lo, hi = row[f"{q}_estimate"], row[f"{q}_ci_low"], row[f"{q}_ci_high"]
    if percent:
        inner = "unbounded" if not (np.isfinite(lo) and np.isfinite(hi)) else f"{100 * lo:.0f}, {100 * hi:.0f}"
        return f"{100 * est:.0f} % [{inner}]"
    return f"{est:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


FAMILY_CAPTION = (
    "β_p: σ at position p minus σ at position 1, per document family (each family's segment sets hold only its own "
    "topics) and pooled over the families; 95 % intervals. change: calibrated minus stock on the same documents; "
    "'toward 0' only when the coefficient keeps its sign and the change's interval lies wholly on the side of 0, "
    "'past 0' when the sign flipped, 'no change' when the interval holds 0. share removed: 1 - calibrated / stock, "
    "Fieller's interval ('unbounded' when the stock β is not distinguishable from 0). Every interval: t(G-1) under the "
    "more conservative (wider) of two-way set+topic and connected-component clustering; G and clusters: those of the "
    "change, and a cell whose interval rests on other clusters names its own G."
)


def family_table(findings: pd.DataFrame, model: str) -> Table:
    """The findings as a report table: rows (calibration, n, configuration, β, family)."""
    paired = "change_estimate" in findings
    index, cells = [], []
    for r in findings.itertuples(index=False):
        row = r._asdict()
        index.append(
            (
                row["calibration"] or STOCK_LABEL,
                int(row["n"]),
                config_label(row["config"], row["n"]),
                f"β{row['position']}",
                row["family"],
            )
        )
        q = "change" if paired else "stock"

        def own_g(x: str, row=row, q=q) -> str:  # a quantity whose interval rests on other clusters than the row's
            return "" if row[f"{x}_G"] == row[f"{q}_G"] else f" (G={int(row[f'{x}_G'])}, {row[f'{x}_kind']})"

        cell = [_ci(row, "stock") + own_g("stock")]
        if paired:
            cell += [
                _ci(row, "calibrated") + own_g("calibrated"),
                f"{_ci(row, 'change')} {row['direction']}",
                _ci(row, "share", percent=True) + own_g("share"),
            ]
        cell += [str(int(row[f"{q}_G"])), row[f"{q}_clusters"]]
        cells.append(cell)
    columns = ["stock"] + (["calibrated", "change", "share removed"] if paired else []) + ["G", "clusters"]
    frame = pd.DataFrame(
        cells,
        columns=columns,
        index=pd.MultiIndex.from_tuples(index, names=["calibration", "n", "configuration", "β", "family"])
        if index
        else None,
    )
    return Table(f"Per document family: β stock and calibrated ({model})", frame, FAMILY_CAPTION, "families")


HETEROGENEITY_CAPTION = (
    "Do the document families agree? Cochran's Q of the per-family estimates weighted by 1/SE² (the SEs of the "
    "family table; for the share removed the delta method's), p from chi²(k-1) for k families, I² = the share of "
    "the spread beyond chance. A small p: the pooled figure does not describe every family; state it per family."
)


def heterogeneity_table(het: pd.DataFrame, model: str) -> Table:
    """:func:`heterogeneity` as a report table."""
    index, cells = [], []
    for r in het.itertuples(index=False):
        index.append(
            (r.calibration or STOCK_LABEL, int(r.n), config_label(r.config, r.n), f"β{r.position}", r.quantity)
        )
        cells.append([f"{r.Q:.2f}", str(int(r.df)), f"{r.p:.3g}", f"{100 * r.I2:.0f} %", r.families])
    frame = pd.DataFrame(
        cells,
        columns=["Q", "df", "p", "I²", "per family"],
        index=pd.MultiIndex.from_tuples(index, names=["calibration", "n", "configuration", "β", "quantity"])
        if index
        else None,
    )
    return Table(
        f"Heterogeneity across document families ({model})", frame, HETEROGENEITY_CAPTION, "families_heterogeneity"
    )


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()} for r in
            frame.to_dict("records")]  # fmt: skip


def families_json(findings: pd.DataFrame, het: pd.DataFrame) -> dict[str, Any]:
    """What ``families.json`` holds: the findings, the heterogeneity tests and what they mean."""
    return {
        "description": FAMILY_CAPTION,
        "heterogeneity_description": HETEROGENEITY_CAPTION,
        "findings": _records(findings),
        "heterogeneity": _records(het),
    }


# -- the audit's report section and files --------------------------------------------------------------------------

_SECTION = """\
<p>Each document family audited on its own segment sets, and pooled: a finding that holds on one family need not \
hold on another. β<sub>p</sub> stock and calibrated, the change under calibration and the share removed with their \
intervals, then Cochran's Q across the families ({{ families }}).</p>
{% for t in tables %}{{ t | safe }}
{% endfor %}"""


def family_tables(result: AuditFindings) -> list[Table]:
    """The family table and the heterogeneity table of an audit run by family (none otherwise)."""
    if len(families_of(result.observations)) < 2:
        return []
    found = result.family_findings()
    name = result.model["name"]
    return [family_table(found, name), heterogeneity_table(heterogeneity(found), name)]


def family_section(result: AuditFindings):
    """The report section ``Families`` (None for an audit not run by family)."""

    tables = family_tables(result)
    if not tables:
        return None
    html = render_string(
        _SECTION, families=", ".join(families_of(result.observations)), tables=[to_html(t) for t in tables]
    )
    return Section("Families", html)


def save_families(result: AuditFindings, out: Path) -> dict[str, Path]:
    """``families.json`` and the two tables (md/csv/tex) of an audit run by family; {} otherwise."""

    paths: dict[str, Path] = {}
    if len(families_of(result.observations)) < 2:
        return paths
    found = result.family_findings()
    paths["families"] = atomic_write_json(out / "families.json", families_json(found, heterogeneity(found)))
    for t in family_tables(result):
        for kind, p in write_table(t, out / "tables").items():
            paths[f"table:{t.name}.{kind}"] = p
    return paths
