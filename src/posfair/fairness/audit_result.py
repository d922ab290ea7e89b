"""The audit result (:class:`AuditResult`): the findings (:class:`~posfair.fairness.findings.AuditFindings`) with
their figures, HTML report and files.

The numbers and their views are :mod:`posfair.fairness.findings`'; drawing and writing them is
:mod:`posfair.fairness.audit_report`'s, which reads the findings and never this module, so the imports run one way:
result -> renderer -> findings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from posfair.fairness import audit_report
from posfair.fairness.findings import AuditFindings
from posfair.report.html import FigureRef, Section

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["AuditResult"]


class AuditResult(AuditFindings):
    """Everything an audit produced (in memory); :meth:`save` writes it out."""

    # -- figures, report, files (posfair.fairness.audit_report) -------------------------------------
    def figure(self, setting: str = "main", title: str = "") -> Figure:
        """Mean sigma / tau per position with 95% intervals over segment sets; grid n x config; variants overlaid."""
        return audit_report.profile_figure(self, setting, title)

    def fidelity_figure(self, setting: str = "main", title: str = "") -> Figure:
        """Profile spread of σ against own-segment recall@n, one point per variant and instance, stock marked."""
        return audit_report.fidelity_figure(self, setting, title)

    def report_sections(
        self, figures: list[FigureRef] | None = None, extra_sections: list[Section] | None = None
    ) -> list[Section]:
        """The sections of the HTML report (``extra_sections`` go before the run parameters)."""
        return audit_report.report_sections(self, figures, extra_sections)

    def save(
        self, out_dir, *, extra_sections: list[Section] | None = None, title: str | None = None, state=("cache",)
    ) -> dict[str, Path]:
        """Write observations (Parquet), coefficients (CSV), tables (md/csv/tex), figures (png/pdf), report (HTML),
        run.json, and ``posfair-run.json`` listing them (an earlier audit's other files in the folder are removed;
        ``state``: the folder's sub-folders of resumable state, such as the embedding cache, left alone)."""
        return audit_report.save_result(self, out_dir, extra_sections=extra_sections, title=title, state=state)
