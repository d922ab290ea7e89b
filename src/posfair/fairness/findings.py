"""What an audit computed: observations, OLS coefficients and the views on them (:class:`AuditFindings`).

``AuditFindings.observations`` has one row per (variant, document, position) with
the ids needed to join further measures later (``doc_id``, ``set_id``,
``permutation``, ``position``, ``segment_id``, ``lang``, ``calibration``,
``setting``).  Further per-observation measures become extra columns;
further report parts are passed as ``extra_sections`` to :meth:`AuditResult.report_sections`.

The numbers are computed in :mod:`posfair.fairness.analysis` (and :mod:`posfair.fairness.families`), formatted as
tables in :mod:`posfair.fairness.audit_tables`.  Computing only: the renderers
(:mod:`posfair.fairness.audit_report`, :mod:`~posfair.fairness.family_report`, :mod:`~posfair.fairness.language_report`)
read these findings, and :class:`posfair.fairness.audit_result.AuditResult` -- what :func:`posfair.audit` returns -- adds
their figures, report and files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from posfair.calibration import Calibration
from posfair.corpus.aligned import corpus_title
from posfair.encoding.evaluator_base import metric_name_part
from posfair.fairness.analysis import (
    clusters_used_text,
    coverage_summary,
    few_clusters_message,
    fidelity_summary,
    fit_instance,
    headline_clusters,
    inference_labels,
    inference_summary,
    is_noop,
)
from posfair.fairness.audit_tables import (
    coefficient_detail_table,
    coefficient_table,
    coverage_table,
    fidelity_table,
    format_estimate,
)
from posfair.fairness.experiment import FIDELITY, MEASURES, STOCK_LABEL
from posfair.fairness.families import family_findings, heterogeneity
from posfair.report.tables import Table
from posfair.stats.inference import Inference, describe_inference
from posfair.stats.position_ols import PositionOLS

__all__ = ["AuditFindings"]


@dataclass
class AuditFindings:
    """Everything an audit computed (in memory): its numbers and the views on them, no rendering."""

    model: dict[str, Any]
    corpus: dict[str, Any]
    settings: dict[str, Any]
    calibrations: list[dict[str, Any]]
    observations: pd.DataFrame
    coefficients: pd.DataFrame
    sampling: list[dict[str, Any]]
    timings: dict[str, float] = field(default_factory=dict)

    # -- views -------------------------------------------------------------------------------
    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(self.observations["config"]))

    @property
    def variants(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys(zip(self.observations["calibration"], self.observations["setting"], strict=True)))

    @property
    def measures(self) -> list[str]:
        return [m for m in MEASURES if m in self.observations and self.observations[m].notna().any()]

    @property
    def inference(self) -> Inference:
        """The :class:`~posfair.stats.inference.Inference` of the run (from its settings)."""
        s, d = self.settings, Inference()
        return Inference(
            method=s.get("inference", d.method),
            draws=s.get("bootstrap_draws", d.draws),
            weights=s.get("bootstrap_weights", d.weights),
            seed=s.get("bootstrap_seed", d.seed),
            clusters=s.get("clusters", "set"),  # a run saved before clusters were chosen clustered by set
        )

    def coefficient(
        self,
        *,
        measure: str = "sigma",
        calibration: str = STOCK_LABEL,
        setting: str = "main",
        n: int,
        config: str,
        position: int,
    ) -> pd.Series:
        c = self.coefficients
        hit = c[
            (c["measure"] == measure)
            & (c["calibration"] == calibration)
            & (c["setting"] == setting)
            & (c["n"] == n)
            & (c["config"] == config)
            & (c["position"] == position)
        ]
        if not len(hit):
            raise KeyError(f"no coefficient for {measure}/{calibration}/{setting}/n={n}/{config}/position {position}")
        return hit.iloc[0]

    def ols(
        self, *, measure: str = "sigma", calibration: str = STOCK_LABEL, setting: str = "main", n: int, config: str
    ) -> PositionOLS:
        """The regression behind one block of :attr:`coefficients`, refitted with the run's inference.

        ``.result`` is statsmodels' results object (``summary()``, ``conf_int()``, ...); the numbers are
        those of the coefficient rows (``conf_int()`` = ``ci_low`` / ``ci_high``).
        """
        return fit_instance(
            self.observations,
            measure=measure,
            calibration=calibration,
            setting=setting,
            n=n,
            config=config,
            inference=self.inference,
        )

    def tables(self) -> list[Table]:
        out = []
        for m in self.measures:
            for cal, setting in self.variants:
                if setting == "control" and m != "sigma":
                    continue
                kw = dict(model=self.model["name"], measure=m, calibration=cal, setting=setting, configs=self.configs)
                out.append(coefficient_table(self.coefficients, **kw, coverage=self.coverage()))
                out.append(coefficient_detail_table(self.coefficients, **kw))
        if self.has_fidelity:
            out.append(fidelity_table(self.fidelity(), self.model["name"]))
        if self.calibrations:
            out.append(coverage_table(self.coverage(), self.model["name"]))
        return out

    def coverage(self) -> pd.DataFrame:
        """:func:`coverage_summary`: calibrated share of the documents per (calibration, n, config)."""
        return coverage_summary(self.observations, self.calibrations, self.model.get("pooling", "cls"))

    def noop_calibrations(self) -> list[str]:
        """Labels of the calibrations that changed no document of the audit."""
        return [c["label"] for c in self.calibrations if is_noop(self.coverage(), c["label"])]

    @property
    def has_fidelity(self) -> bool:
        return all(c in self.observations for c in FIDELITY) and len(self.observations) > 0

    def fidelity(self) -> pd.DataFrame:
        """:func:`fidelity_summary` of this result (numeric, with ``calibrated_share``)."""
        return fidelity_summary(self.observations, self.coefficients, self.coverage())

    def headline(self) -> dict[str, float]:
        """Flat dict of headline numbers (ST-evaluator style keys)."""
        out: dict[str, float] = {}
        c = self.coefficients
        for r in c.itertuples(index=False):
            base = f"{metric_name_part(r.calibration)}_{r.setting}_{r.measure}_n{r.n}_{r.config_key}_{r.coef}"
            out[base] = float(r.estimate)
            if r.position > 1:
                out[base + "_p"] = float(r.p)
        for (cal, setting, m), g in c[c["position"] > 1].groupby(["calibration", "setting", "measure"], sort=False):
            out[f"{metric_name_part(cal)}_{setting}_{m}_mean_later_beta"] = float(g["estimate"].mean())
        for (cal, setting), g in self.observations.groupby(["calibration", "setting"], sort=False):
            out[f"{metric_name_part(cal)}_{setting}_sigma_mean"] = float(g["sigma"].mean())
        cov = self.coverage()
        for label, g in cov[cov["calibrated_share"].notna()].groupby("calibration", sort=False):
            out[f"{metric_name_part(label)}_calibrated_share"] = float(
                g["calibrated"].sum() / max(1, g["documents"].sum())
            )
        if self.has_fidelity:
            fid = self.fidelity()
            for r in fid.itertuples(index=False):
                for m in ("spread", "max_abs_beta", "margin", "other_cos", "recall", "drift"):
                    out[f"{metric_name_part(r.calibration)}_{r.setting}_{m}_n{r.n}_{r.config_key}"] = float(
                        getattr(r, m)
                    )
            for (cal, setting), g in fid.groupby(["calibration", "setting"], sort=False):
                for m in ("spread", "margin", "recall", "drift"):
                    out[f"{metric_name_part(cal)}_{setting}_{m}_mean"] = float(g[m].mean())
        return out

    def headline_frame(self, positions=None, measure: str = "sigma") -> pd.DataFrame:
        """beta_p with marks per instance, one column per variant (main setting); ``positions``: which p
        (default every position 2..n of each instance)."""
        c = self.coefficients
        c = c[(c["measure"] == measure) & (c["setting"] == "main") & (c["position"] >= 2)]
        if positions is not None:
            c = c[c["position"].isin(positions)]
        c = c.assign(cell=[format_estimate(e, m, 3) for e, m in zip(c["estimate"], c["mark"], strict=True)])
        hf = c.pivot_table(
            index=["n", "config", "coef"], columns="calibration", values="cell", aggfunc="first", sort=False
        )
        if len(hf):  # G: the clusters the marks of the row rest on, and what a cluster is (analysis.headline_clusters)
            g = c.groupby(["n", "config", "coef"]).apply(headline_clusters, include_groups=False)
            hf["G"] = [g.loc[key] for key in hf.index]
        return hf

    def family_findings(self) -> pd.DataFrame:
        """Per document family and pooled: β_p stock and calibrated, the change and the share removed with their
        intervals (:func:`posfair.fairness.families.family_findings`; pooled rows only for an audit not run by family)."""
        return family_findings(self.observations, [c["label"] for c in self.calibrations])

    def family_heterogeneity(self) -> pd.DataFrame:
        """Cochran's Q across the document families (:func:`posfair.fairness.families.heterogeneity`)."""
        return heterogeneity(self.family_findings())

    def few_clusters_message(self) -> str | None:
        """The G < 20 line (None if every instance has at least 20 clusters)."""
        return few_clusters_message(self.coefficients)

    def calibration_settings(self) -> dict[str, Calibration]:
        """Each calibration of the audit by its label (the run's records read back as :class:`Calibration`)."""
        keys = {"label", "key"}
        return {
            c["label"]: Calibration.from_dict({k: v for k, v in c.items() if k not in keys}) for c in self.calibrations
        }

    def figure_labels(self) -> dict[str, str]:
        """Each label of the audit (stock's and every calibration's) -> its short name for figures
        (:meth:`Calibration.figure_label`; :func:`posfair.report.plots.display_labels` keeps two alike whole)."""
        return {STOCK_LABEL: STOCK_LABEL, **{lab: c.figure_label() for lab, c in self.calibration_settings().items()}}

    def figure_subtitle(self) -> str:
        """What every figure of this audit is of: the model, its token limit, the corpus, each calibration in words."""
        words = [f"{label}: {c.describe()}" for label, c in self.calibration_settings().items()]
        corpus = self.corpus.get("name") or ""
        limit = f" · token limit {self.model['limit']}" if self.model.get("limit") else ""
        if corpus:
            corpus = corpus_title(corpus)
        head = f"{self.model.get('name', '')}{limit}" + (f" · {corpus}" if corpus else "")
        return head + ("\n" + "; ".join(words) if words else " · stock only")

    def inference_text(self) -> str:
        """What the p-values rest on (from the coefficients' inference labels)."""
        c = self.coefficients
        if "inference" not in c or not len(c):
            return ""
        return f"{describe_inference(inference_labels(c))}. {clusters_used_text(c)}".rstrip(". ") + "."

    def inference_summary(self) -> str:
        """:meth:`inference_text` in one short line (the labels and the G the intervals rest on, e.g. ``CR1
        conservative t(G-1), G = 2 to 5 sets``), for a terminal's summary; "" without coefficients."""
        return inference_summary(self.coefficients)
