"""The audit's tables: the paper's coefficient layout, every coefficient in detail, fidelity and coverage.

Each function formats numbers from :mod:`posfair.fairness.analysis` into a
:class:`posfair.report.tables.Table` (cells as strings: estimates with their
significance marks, G, calibrated shares), which the report package writes as
Markdown, CSV, LaTeX and HTML.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from posfair.calibration.coverage import NOOP_LABEL, SHARE_NAME, format_share
from posfair.encoding.evaluator_base import metric_name_part
from posfair.fairness.analysis import cluster_kinds, few_clusters, inference_labels, is_noop, share_of
from posfair.fairness.documents import MIXED_CONFIG, config_label
from posfair.report.tables import Table
from posfair.stats.inference import FEW_CLUSTERS, MARK_LEGEND, describe_inference

__all__ = [
    "coefficient_table",
    "coefficient_detail_table",
    "fidelity_table",
    "coverage_table",
    "headline_table",
    "config_label",
    "MIXED_CONFIG",
    "coef_label",
    "MEASURE_TITLES",
    "CLUSTER_ROW",
    "SHARE_ROW",
    "FIDELITY_CAPTION",
    "COVERAGE_CAPTION",
    "format_estimate",
]

MEASURE_TITLES = {  # σ and τ as every table, caption and figure of the report writes them
    "sigma": "positional fairness (σ = cos(document, standalone segment))",
    "tau": "information retention (τ = cos(standalone, contextualised segment))",
}
CLUSTER_ROW = "G (clusters)"
SHARE_ROW = SHARE_NAME
#: the legend line of the rows under each n block of :func:`coefficient_table`
SHARE_LEGEND = f"{SHARE_NAME}: the fraction of the instance's documents the calibration changed (— for stock)"


def coef_label(coef: str | int) -> str:
    """A coefficient as the tables name it: ``beta_2`` or 2 -> ``β2 (2 vs. 1)``, ``beta_0`` or 1 -> ``β0 (intercept)``."""
    position = int(str(coef).removeprefix("beta_")) if not isinstance(coef, (int, np.integer)) else int(coef)
    return _coef_label(1 if position == 0 else position)


def format_estimate(estimate: float, mark: str, digits: int) -> str:
    """``estimate`` to ``digits`` decimals (never "-0.000") followed by its significance mark."""
    s = f"{estimate:.{digits}f}"
    if s.startswith("-") and float(s) == 0:
        s = s[1:]
    return s + (f" {mark}" if mark else "")


def _fmt_p(p: float) -> str:
    if p is None or not np.isfinite(p):
        return ""
    return f"{p:.3g}"


def _few_note(sub: pd.DataFrame) -> str:
    few = few_clusters(sub)
    if not len(few):
        return ""
    which = ", ".join(f"n={r.n} {config_label(r.config, r.n)} (G={r.clusters})" for r in few.itertuples(index=False))
    return f" Fewer than {FEW_CLUSTERS} segment sets, p-values approximate: {which}."


def _inference_caption(sub: pd.DataFrame) -> str:
    labels = list(dict.fromkeys(inference_labels(sub))) if len(sub) else []
    return f"Inference: {describe_inference(labels)}." if labels else ""


def _coef_label(position: int) -> str:
    return "β0 (intercept)" if position == 1 else f"β{position} ({position} vs. 1)"


def _index(index: list[tuple], names: list[str]) -> pd.MultiIndex | None:
    return pd.MultiIndex.from_tuples(index, names=names) if index else None


def coefficient_table(
    coefs: pd.DataFrame,
    *,
    model: str,
    measure: str,
    calibration: str,
    setting: str,
    configs: list[str],
    digits: int = 3,
    coverage: pd.DataFrame | None = None,
) -> Table:
    """The paper's Table 1 layout: rows (n, β_k), columns language configurations (:func:`config_label`:
    written out where the table is of one n).

    Each n block ends with a row ``G (clusters)``: the clusters every p-value (mark) of the
    block rests on; the caption names the inference and the instances with G < 20.  With
    ``coverage`` (:func:`~posfair.fairness.analysis.coverage_summary`) a row ``calibrated share``
    follows: the fraction of the instance's documents the calibration changed ("—" for stock), said
    in the caption; a calibration that changed none is marked "no-op: nothing calibrated" in the title (its
    coefficients are the stock ones).
    """
    sub = coefs[(coefs["measure"] == measure) & (coefs["calibration"] == calibration) & (coefs["setting"] == setting)]
    index, cells = [], []
    for n in sorted(sub["n"].unique()):
        for pos in range(1, int(n) + 1):
            index.append((int(n), _coef_label(pos)))
            row = []
            for c in configs:
                hit = sub[(sub["n"] == n) & (sub["config"] == c) & (sub["position"] == pos)]
                row.append(
                    format_estimate(hit["estimate"].iloc[0], "" if pos == 1 else hit["mark"].iloc[0], digits)
                    if len(hit)
                    else ""
                )
            cells.append(row)
        index.append((int(n), CLUSTER_ROW))
        g_row = []
        for c in configs:
            hit = sub[(sub["n"] == n) & (sub["config"] == c)]
            # one G per instance, or each coefficient's (β0/β2/...) where their intervals used different clusterings
            gs = [str(int(g)) for g in hit.sort_values("position")["clusters"]]
            g_row.append("/".join(gs) if len(set(gs)) > 1 else "".join(gs[:1]))
        cells.append(g_row)
        if coverage is not None:
            index.append((int(n), SHARE_ROW))
            cells.append([format_share(share_of(coverage, calibration, n, c)) for c in configs])
    ns = sorted({int(n) for n in sub["n"]})
    columns = [config_label(c, ns[0] if len(ns) == 1 else None) for c in configs]
    frame = pd.DataFrame(cells, columns=columns, index=_index(index, ["n", "coefficient"]))
    variant = calibration if setting == "main" else f"{calibration}, control: calibrated documents vs stock segments"
    if coverage is not None and is_noop(coverage, calibration):
        variant += f" — {NOOP_LABEL}, identical to stock"
    return Table(
        title=f"OLS coefficients, {MEASURE_TITLES[measure].split(' (')[0]} ({model}, {variant})",
        frame=frame,
        caption=(
            f"{MEASURE_TITLES[measure]}. OLS on position dummies (position 1 = baseline), cluster-robust standard "
            f"errors; G = the clusters the p-values rest on{_cluster_counts(sub)}. {_inference_caption(sub)} "
            f"Statistical significance: {MARK_LEGEND}.{_few_note(sub)}"
            + (f" {SHARE_LEGEND}." if coverage is not None else "")
        ),
        name=f"{measure}_{metric_name_part(calibration)}_{setting}",
    )


def coefficient_detail_table(
    coefs: pd.DataFrame,
    *,
    model: str,
    measure: str,
    calibration: str,
    setting: str,
    configs: list[str],
    digits: int = 4,
) -> Table:
    """Every coefficient with its SE, t, p-value, mark, G and inference: rows (n, configuration, coefficient)."""
    sub = coefs[(coefs["measure"] == measure) & (coefs["calibration"] == calibration) & (coefs["setting"] == setting)]
    sub = sub.assign(kind=cluster_kinds(sub))
    index, cells = [], []
    for n in sorted(sub["n"].unique()):
        for c in configs:
            for r in sub[(sub["n"] == n) & (sub["config"] == c)].sort_values("position").itertuples(index=False):
                index.append((int(n), config_label(c, n), _coef_label(r.position)))
                cells.append(
                    [
                        format_estimate(r.estimate, "", digits),
                        f"{r.se:.{digits}f}",
                        f"{r.t:.2f}" if np.isfinite(r.t) else "",
                        _fmt_p(r.p),
                        "" if r.position == 1 else r.mark,
                        str(int(r.clusters)),
                        r.kind,
                        r.inference,
                    ]
                )
    columns = ["estimate", "SE", "t", "p", "mark", "G", "clusters", "inference"]
    frame = pd.DataFrame(cells, columns=columns, index=_index(index, ["n", "configuration", "coefficient"]))
    variant = calibration if setting == "main" else f"{calibration}, control"
    return Table(
        title=f"OLS coefficients with standard errors and p-values, {MEASURE_TITLES[measure].split(' (')[0]} ({model}, {variant})",
        frame=frame,
        caption=(
            f"{MEASURE_TITLES[measure]}. SE: CR1 cluster-robust; G: the clusters the p-value rests on{_cluster_counts(sub)}. "
            f"{_inference_caption(sub)} Marks: {MARK_LEGEND}.{_few_note(sub)}"
        ),
        name=f"{measure}_{metric_name_part(calibration)}_{setting}_detail",
    )


def _cluster_counts(sub: pd.DataFrame) -> str:
    """`` (n=3 en: set+topic (48 sets, 144 topics); ...)``: what a cluster is in each instance, with the counts;
    where its coefficients' intervals used different clusterings (``conservative``), each coefficient's."""
    if "cluster_by" not in sub or not len(sub):
        return ""
    parts = []
    for (n, config), g in sub.groupby(["n", "config"], sort=False):
        if g["cluster_by"].nunique() == 1:
            parts.append(f"n={n} {config_label(config, n)}: {g['cluster_by'].iloc[0]}")
        else:
            each = ", ".join(
                f"{_coef_label(r.position).split(' ')[0]} G={int(r.clusters)} {r.cluster_by}" for r in g.itertuples()
            )
            parts.append(f"n={n} {config_label(config, n)}: {each}")
    return " (" + "; ".join(parts) + ")"


FIDELITY_CAPTION = (
    "σ by position: mean cos(document, standalone segment) at positions 1..n; spread: max - min of those means; "
    "slope: their least-squares slope per position step (negative: earlier positions represented better; a sign "
    "other than stock's is a reversed profile, bias the other way); "
    "max |β|: the largest |β_p| (p ≥ 2) of the σ regression; other-set cos: mean cos(document, standalone segments of "
    "the other segment sets of the instance); margin: σ minus that (per position, and overall); recall@n: share of the "
    "document's n segments among its n most similar standalone segments (its own n and those of every other set); "
    "drift: cos(document, stock embedding of the same document), 1 for stock. Control rows compare the calibrated "
    "documents with stock standalone segments."
)


def _profile(row: pd.Series, prefix: str) -> str:
    return "/".join(f"{row[f'{prefix}_p{p}']:.3f}" for p in range(1, int(row["n"]) + 1))


def fidelity_table(summary: pd.DataFrame, model: str) -> Table:
    """The fidelity summary (:func:`~posfair.fairness.analysis.fidelity_summary`) formatted: rows (n, configuration, variant)."""
    index, cells = [], []
    shares = "calibrated_share" in summary.columns
    for r in summary.itertuples(index=False):
        s = pd.Series(r._asdict())
        variant = r.calibration if r.setting == "main" else f"{r.calibration} (control)"
        index.append((int(r.n), config_label(r.config, r.n), variant))
        cells.append(
            [
                _profile(s, "sigma"),
                f"{r.spread:.3f}",
                "" if pd.isna(getattr(r, "slope", np.nan)) else f"{r.slope:+.4f}",
                "" if pd.isna(r.max_abs_beta) else f"{r.max_abs_beta:.3f}",
                f"{r.other_cos:.3f}",
                _profile(s, "margin"),
                f"{r.margin:.3f}",
                f"{r.recall:.3f}",
                f"{r.drift:.3f}",
            ]
            + ([format_share(s["calibrated_share"])] if shares else [])
        )
    columns = [
        "σ by position",
        "spread",
        "slope",
        "max |β|",
        "other-set cos",
        "margin by position",
        "margin",
        "recall@n",
        "drift",
    ]
    columns += [SHARE_NAME] if shares else []
    frame = pd.DataFrame(cells, columns=columns, index=_index(index, ["n", "configuration", "variant"]))
    return Table(
        title=f"Fidelity: what calibration costs ({model})", frame=frame, caption=FIDELITY_CAPTION, name="fidelity"
    )


COVERAGE_CAPTION = (
    "calibrated share: fraction of the instance's documents whose embedding the calibration changes. A document whose "
    "content (its tokens minus the isolated BOS/EOS keys) is shorter than one basket is encoded stock (the authors' rule), "
    "and so is one of exactly one basket when no isolated key is reweighted (calibration is then the identity). "
    f"Share 0 = {NOOP_LABEL}: the calibrated figures are the stock ones. Standalone segments follow the same rule."
)


def coverage_table(coverage: pd.DataFrame, model: str) -> Table:
    """:func:`~posfair.fairness.analysis.coverage_summary` formatted: rows (calibration, n, configuration)."""
    cov = coverage[coverage["calibrated_share"].notna()]
    index = [(r.calibration, int(r.n), config_label(r.config, r.n)) for r in cov.itertuples(index=False)]
    cells = [
        [str(int(r.documents)), str(int(r.calibrated)), format_share(r.calibrated_share)]
        for r in cov.itertuples(index=False)
    ]
    frame = pd.DataFrame(
        cells,
        columns=["documents", "calibrated", SHARE_NAME],
        index=_index(index, ["calibration", "n", "configuration"]),
    )
    return Table(
        title=f"Calibrated share per configuration ({model})", frame=frame, caption=COVERAGE_CAPTION, name="coverage"
    )


def headline_table(hf: pd.DataFrame, title: str, caption: str = "", name: str = "headline") -> Table:
    """:meth:`~posfair.fairness.audit_result.AuditResult.headline_frame` as a reader reads it: rows (n, configuration,
    coefficient) named as the OLS tables name them (``[de, en, en]``, ``β2 (2 vs. 1)``), not by the frame's keys
    (``[de, en, ..., en]``, ``beta_2``)."""
    frame = hf.copy()
    if len(frame):
        frame.index = _index(
            [(int(n), config_label(c, n), coef_label(k)) for n, c, k in frame.index],
            ["n", "configuration", "coefficient"],
        )
    frame.columns = [str(c) for c in frame.columns]
    return Table(title, frame, caption, name)
