"""The audit result: observations, OLS coefficients, tables, figures and the HTML report.

``AuditResult.observations`` has one row per (variant, document, position) with
the ids needed to join further measures later (``doc_id``, ``set_id``,
``permutation``, ``position``, ``segment_id``, ``lang``, ``calibration``,
``setting``).  Further per-observation measures become extra columns;
further report parts are passed as ``extra_sections`` to :meth:`AuditResult.report_sections`.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.calibration.coverage import NOOP_LABEL, calibration_coverage, format_share
from posfair.fairness.experiment import FIDELITY, MEASURES, STOCK
from posfair.fairness.metrics import profile_spread
from posfair.fairness.ols import FEW_CLUSTERS, MARK_LEGEND, FewClustersWarning, Inference, describe_inference, fit_position_ols
from posfair.io import atomic_write_json, atomic_write_parquet, atomic_write_text
from posfair.report.html import FigureRef, Section, key_value_html, write_report
from posfair.report.plots import ProfileSeries, profile_grid, save_figure, tradeoff_scatter
from posfair.report.tables import Table, to_html, to_markdown, write_table

__all__ = [
    "AuditResult", "fit_all", "coefficient_table", "coefficient_detail_table", "few_clusters", "few_clusters_message",
    "fidelity_summary", "fidelity_table", "MEASURE_TITLES", "coverage_summary", "coverage_table", "coverage_messages",
]  # fmt: skip

MEASURE_TITLES = {
    "sigma": "positional fairness (sigma = cos(document, standalone segment))",
    "tau": "information retention (tau = cos(standalone, contextualised segment))",
}
GROUP = ["calibration", "setting", "measure", "n", "config"]


def fit_all(observations: pd.DataFrame, measures=MEASURES, inference: Inference | str | None = None, *, warn: bool = True) -> pd.DataFrame:
    """OLS per (calibration, setting, measure, n, config): long table of coefficients.

    ``inference``: :class:`~posfair.fairness.ols.Inference` (default CR1 + t(G-1)).  Columns
    ``clusters`` (G, segment sets) and ``inference`` (a short label) say what each p-value rests
    on.  ``warn``: one :class:`~posfair.fairness.ols.FewClustersWarning` naming every instance
    with G < 20 (see :func:`few_clusters`).
    """
    inference = Inference.coerce(inference)
    rows = []
    keys = ["calibration", "setting", "n", "config"]
    for key, g in observations.groupby(keys, sort=False):
        for m in measures:
            y = g[m].to_numpy(dtype=float)
            if not np.isfinite(y).any():
                continue
            fit = fit_position_ols(y, g["position"].to_numpy(), g["set_id"].to_numpy(), n=int(key[2]), inference=inference, warn=False)
            f = fit.to_frame()
            for name, val in zip(keys, key):
                f[name] = val
            f["measure"] = m
            f["config_key"] = g["config_key"].iloc[0]
            rows.append(f)
    if not rows:
        return pd.DataFrame(columns=GROUP + COEF_COLUMNS)
    out = pd.concat(rows, ignore_index=True)[GROUP + COEF_COLUMNS]
    message = few_clusters_message(out)
    if warn and message:
        warnings.warn(message, FewClustersWarning, stacklevel=2)
    return out


COEF_COLUMNS = ["config_key", "coef", "position", "estimate", "se", "t", "p", "mark", "nobs", "clusters", "inference"]


def few_clusters(coefs: pd.DataFrame) -> pd.DataFrame:
    """The instances (n, config) whose regressions rest on fewer than 20 segment sets, with G."""
    if not len(coefs) or "clusters" not in coefs:
        return pd.DataFrame(columns=["n", "config", "clusters"])
    c = coefs[coefs["clusters"] < FEW_CLUSTERS]
    return c.drop_duplicates(["n", "config", "clusters"])[["n", "config", "clusters"]].reset_index(drop=True)


def few_clusters_message(coefs: pd.DataFrame) -> str | None:
    """One line naming every instance with G < 20 (None if there is none): the warning, CLI and report text."""
    few = few_clusters(coefs)
    if not len(few):
        return None
    total = coefs.drop_duplicates(["n", "config"]).shape[0]
    which = "; ".join(f"n={r.n} {r.config}: G={r.clusters}" for r in few.itertuples(index=False))
    labels = ", ".join(dict.fromkeys(coefs["inference"])) if "inference" in coefs else ""
    return (
        f"{len(few)} of {total} instances rest on fewer than {FEW_CLUSTERS} segment sets (clusters G) -- {which}. "
        f"Their p-values ({labels}) are approximate with so few clusters; more documents (more segment sets) "
        "or --inference wild give sturdier tests."
    )


def _fmt(estimate: float, mark: str, digits: int) -> str:
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
    which = ", ".join(f"n={r.n} {r.config} (G={r.clusters})" for r in few.itertuples(index=False))
    return f" Fewer than {FEW_CLUSTERS} segment sets, p-values approximate: {which}."


def _inference_caption(sub: pd.DataFrame) -> str:
    labels = list(dict.fromkeys(sub["inference"])) if "inference" in sub and len(sub) else []
    return f"Inference: {describe_inference(labels)}." if labels else ""


def coefficient_table(coefs: pd.DataFrame, *, model: str, measure: str, calibration: str, setting: str, configs: list[str], digits: int = 3,
                      coverage: pd.DataFrame | None = None) -> Table:  # fmt: skip
    """The paper's Table 1 layout: rows (n, beta_k), columns language configurations.

    Each n block ends with a row ``G (segment sets)``: the clusters every p-value (mark) of the
    block rests on; the caption names the inference and the instances with G < 20.  With
    ``coverage`` (:func:`coverage_summary`) a row ``calibrated_share`` follows: the fraction of
    the instance's documents the calibration changed ("—" for stock); a calibration that changed
    none is marked "no-op: nothing calibrated" in the title (its coefficients are the stock ones).
    """
    sub = coefs[(coefs["measure"] == measure) & (coefs["calibration"] == calibration) & (coefs["setting"] == setting)]
    index, cells = [], []
    for n in sorted(sub["n"].unique()):
        for pos in range(1, int(n) + 1):
            label = "β0 (intercept)" if pos == 1 else f"β{pos} ({pos} vs. 1)"
            index.append((int(n), label))
            row = []
            for c in configs:
                hit = sub[(sub["n"] == n) & (sub["config"] == c) & (sub["position"] == pos)]
                row.append(_fmt(hit["estimate"].iloc[0], "" if pos == 1 else hit["mark"].iloc[0], digits) if len(hit) else "")
            cells.append(row)
        index.append((int(n), CLUSTER_ROW))
        g_row = []
        for c in configs:
            hit = sub[(sub["n"] == n) & (sub["config"] == c)]
            g_row.append(str(int(hit["clusters"].iloc[0])) if len(hit) else "")
        cells.append(g_row)
        if coverage is not None:
            index.append((int(n), SHARE_ROW))
            cells.append([_share_cell(coverage, calibration, n, c) for c in configs])
    frame = pd.DataFrame(cells, columns=configs, index=pd.MultiIndex.from_tuples(index, names=["n", "coefficient"]) if index else None)
    variant = calibration if setting == "main" else f"{calibration}, control: calibrated documents vs stock segments"
    if coverage is not None and _noop(coverage, calibration):
        variant += f" — {NOOP_LABEL}, identical to stock"
    stem = f"{measure}_{_safe(calibration)}_{setting}"
    return Table(
        title=f"OLS coefficients, {MEASURE_TITLES[measure].split(' (')[0]} ({model}, {variant})",
        frame=frame,
        caption=(
            f"{MEASURE_TITLES[measure]}. OLS on position dummies (position 1 = baseline), standard errors clustered "
            f"by segment set; G = number of segment sets (clusters). {_inference_caption(sub)} "
            f"Statistical significance: {MARK_LEGEND}.{_few_note(sub)}"
        ),
        name=stem,
    )


CLUSTER_ROW = "G (segment sets)"
SHARE_ROW = "calibrated_share"


def coefficient_detail_table(
    coefs: pd.DataFrame, *, model: str, measure: str, calibration: str, setting: str, configs: list[str], digits: int = 4
) -> Table:
    """Every coefficient with its SE, t, p-value, mark, G and inference: rows (n, configuration, coefficient)."""
    sub = coefs[(coefs["measure"] == measure) & (coefs["calibration"] == calibration) & (coefs["setting"] == setting)]
    index, cells = [], []
    for n in sorted(sub["n"].unique()):
        for c in configs:
            for r in sub[(sub["n"] == n) & (sub["config"] == c)].sort_values("position").itertuples(index=False):
                label = "β0 (intercept)" if r.position == 1 else f"β{r.position} ({r.position} vs. 1)"
                index.append((int(n), c, label))
                cells.append([
                    _fmt(r.estimate, "", digits), f"{r.se:.{digits}f}", f"{r.t:.2f}" if np.isfinite(r.t) else "", _fmt_p(r.p),
                    "" if r.position == 1 else r.mark, str(int(r.clusters)), r.inference,
                ])  # fmt: skip
    columns = ["estimate", "SE", "t", "p", "mark", "G", "inference"]
    frame = pd.DataFrame(
        cells, columns=columns, index=pd.MultiIndex.from_tuples(index, names=["n", "configuration", "coefficient"]) if index else None
    )
    variant = calibration if setting == "main" else f"{calibration}, control"
    return Table(
        title=f"OLS coefficients with standard errors and p-values, {MEASURE_TITLES[measure].split(' (')[0]} ({model}, {variant})",
        frame=frame,
        caption=(
            f"{MEASURE_TITLES[measure]}. SE: CR1 cluster-robust (clusters = segment sets); G: number of segment sets. "
            f"{_inference_caption(sub)} Marks: {MARK_LEGEND}.{_few_note(sub)}"
        ),
        name=f"{measure}_{_safe(calibration)}_{setting}_detail",
    )


FIDELITY_ALT = "fidelity: σ profile spread against own-segment recall"
FIDELITY_CAPTION = (
    "σ by position: mean cos(document, standalone segment) at positions 1..n; spread: max - min of those means; "
    "max |β|: the largest |β_p| (p ≥ 2) of the σ regression; other-set cos: mean cos(document, standalone segments of "
    "the other segment sets of the instance); margin: σ minus that (per position, and overall); recall@n: share of the "
    "document's n segments among its n most similar standalone segments (its own n and those of every other set); "
    "drift: cos(document, stock embedding of the same document), 1 for stock. Control rows compare the calibrated "
    "documents with stock standalone segments."
)


def fidelity_summary(
    observations: pd.DataFrame, coefficients: pd.DataFrame | None = None, coverage: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per (calibration, setting, n, config): the σ profile, its spread and max |β|, and the fidelity means.

    Per-position columns ``sigma_p<k>`` / ``margin_p<k>`` (NaN beyond n); ``recall`` and ``drift``
    are means over documents (each document counts once).  With ``coverage``
    (:func:`coverage_summary`) a column ``calibrated_share`` (NaN for stock).
    """
    keys = ["calibration", "setting", "n", "config"]
    if not len(observations):
        return pd.DataFrame(columns=keys + ["config_key", "documents", "sets", "spread", "max_abs_beta", *FIDELITY])
    n_max = int(observations["n"].max())
    rows = []
    for key, g in observations.groupby(keys, sort=False):
        by_pos = g.groupby("position")
        per_doc = g.drop_duplicates("doc_id")
        row: dict[str, Any] = dict(zip(keys, key))
        row.update(config_key=g["config_key"].iloc[0], documents=int(g["doc_id"].nunique()), sets=int(g["set_id"].nunique()))
        row["spread"] = profile_spread(g["sigma"].to_numpy(), g["position"].to_numpy())
        row["max_abs_beta"] = np.nan
        if coefficients is not None and len(coefficients):
            c = coefficients
            hit = c[
                (c["measure"] == "sigma")
                & (c["calibration"] == key[0])
                & (c["setting"] == key[1])
                & (c["n"] == key[2])
                & (c["config"] == key[3])
                & (c["position"] > 1)
            ]
            if len(hit):
                row["max_abs_beta"] = float(hit["estimate"].abs().max())
        row["other_cos"] = float(per_doc["other_cos"].mean())
        row["margin"] = float(g["margin"].mean())
        row["recall"] = float(per_doc["recall"].mean())
        row["drift"] = float(per_doc["drift"].mean())
        for p in range(1, n_max + 1):
            row[f"sigma_p{p}"] = float(by_pos["sigma"].mean().get(p, np.nan))
            row[f"margin_p{p}"] = float(by_pos["margin"].mean().get(p, np.nan))
        if coverage is not None:
            row["calibrated_share"] = _share_of(coverage, key[0], key[2], key[3])
        rows.append(row)
    return pd.DataFrame(rows)


def _profile(row: pd.Series, prefix: str) -> str:
    return "/".join(f"{row[f'{prefix}_p{p}']:.3f}" for p in range(1, int(row["n"]) + 1))


def fidelity_table(summary: pd.DataFrame, model: str) -> Table:
    """The fidelity summary formatted: rows (n, configuration, variant)."""
    index, cells = [], []
    shares = "calibrated_share" in summary.columns
    for r in summary.itertuples(index=False):
        s = pd.Series(r._asdict())
        variant = r.calibration if r.setting == "main" else f"{r.calibration} (control)"
        index.append((int(r.n), r.config, variant))
        cells.append([
            _profile(s, "sigma"), f"{r.spread:.3f}", "" if pd.isna(r.max_abs_beta) else f"{r.max_abs_beta:.3f}",
            f"{r.other_cos:.3f}", _profile(s, "margin"), f"{r.margin:.3f}", f"{r.recall:.3f}", f"{r.drift:.3f}",
        ] + ([format_share(s["calibrated_share"])] if shares else []))  # fmt: skip
    columns = ["σ by position", "spread", "max |β|", "other-set cos", "margin by position", "margin", "recall@n", "drift"]
    columns += ["calibrated_share"] if shares else []
    frame = pd.DataFrame(
        cells, columns=columns, index=pd.MultiIndex.from_tuples(index, names=["n", "configuration", "variant"]) if index else None
    )
    return Table(title=f"Fidelity: what calibration costs ({model})", frame=frame, caption=FIDELITY_CAPTION, name="fidelity")


COVERAGE_CAPTION = (
    "calibrated_share: fraction of the instance's documents whose embedding the calibration changes. A document whose "
    "content (its tokens minus the isolated BOS/EOS keys) is shorter than one basket is encoded stock (the authors' rule), "
    "and so is one of exactly one basket when no isolated key is reweighted (calibration is then the identity). "
    f"Share 0 = {NOOP_LABEL}: the calibrated figures are the stock ones. Standalone segments follow the same rule."
)


def coverage_summary(observations: pd.DataFrame, calibrations: list[dict[str, Any]], pooling: str) -> pd.DataFrame:
    """One row per (calibration, n, config): ``documents``, ``calibrated`` and ``calibrated_share`` (NaN for stock).

    Counted with :func:`posfair.calibration.coverage.calibration_coverage` over the documents' token
    counts (``doc_tokens``: special tokens included; documents are built to fit the token limit, so
    none is truncated) and the calibrations' basket rule resolved for ``pooling``.
    """
    from posfair.calibration import Calibration

    cols = ["calibration", "n", "config", "config_key", "documents", "calibrated", "calibrated_share"]
    if not len(observations):
        return pd.DataFrame(columns=cols)
    fields = set(Calibration.__dataclass_fields__)
    by_label = {c["label"]: Calibration.from_dict({k: v for k, v in c.items() if k in fields}) for c in calibrations}
    docs = observations[observations["setting"] == "main"].drop_duplicates(["calibration", "doc_id"])
    rows = []
    for (label, n, config), g in docs.groupby(["calibration", "n", "config"], sort=False):
        row: dict[str, Any] = {
            "calibration": label,
            "n": int(n),
            "config": config,
            "config_key": g["config_key"].iloc[0],
            "documents": int(len(g)),
        }
        cal = by_label.get(label)
        if cal is None:  # stock
            row.update(calibrated=np.nan, calibrated_share=np.nan)
        else:
            cov = calibration_coverage(cal, g["doc_tokens"].to_numpy(), pooling)
            row.update(calibrated=cov.calibrated, calibrated_share=cov.share)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def coverage_table(coverage: pd.DataFrame, model: str) -> Table:
    """:func:`coverage_summary` formatted: rows (calibration, n, configuration)."""
    cov = coverage[coverage["calibrated_share"].notna()]
    index = [(r.calibration, int(r.n), r.config) for r in cov.itertuples(index=False)]
    cells = [[str(int(r.documents)), str(int(r.calibrated)), format_share(r.calibrated_share)] for r in cov.itertuples(index=False)]
    frame = pd.DataFrame(cells, columns=["documents", "calibrated", "calibrated_share"],
                         index=pd.MultiIndex.from_tuples(index, names=["calibration", "n", "configuration"]) if index else None)  # fmt: skip
    return Table(title=f"Calibrated share per configuration ({model})", frame=frame, caption=COVERAGE_CAPTION, name="coverage")


def coverage_messages(coverage: pd.DataFrame) -> list[str]:
    """One line per calibration that left some documents stock (share < 1), over all its instances."""
    out = []
    cov = coverage[coverage["calibrated_share"].notna()]
    for label, g in cov.groupby("calibration", sort=False):
        docs, done = int(g["documents"].sum()), int(g["calibrated"].sum())
        if done < docs:
            what = f"{NOOP_LABEL}, its figures are the stock model's" if done == 0 else f"{docs - done} encoded stock"
            out.append(f"calibration {label}: calibrated share {done / docs:.3f} ({done} of {docs} documents; {what})")
    return out


def _share_of(coverage: pd.DataFrame, calibration: str, n, config: str) -> float:
    hit = coverage[(coverage["calibration"] == calibration) & (coverage["n"] == int(n)) & (coverage["config"] == config)]
    return float(hit["calibrated_share"].iloc[0]) if len(hit) else np.nan


def _share_cell(coverage: pd.DataFrame, calibration: str, n, config: str) -> str:
    return format_share(_share_of(coverage, calibration, n, config))


def _noop(coverage: pd.DataFrame, calibration: str) -> bool:
    g = coverage[coverage["calibration"] == calibration]
    return bool(len(g)) and bool(g["calibrated_share"].notna().all()) and int(g["calibrated"].sum()) == 0


def _safe(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in s)


@dataclass
class AuditResult:
    """Everything an audit produced (in memory); :meth:`save` writes it out."""

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
        return list(dict.fromkeys(zip(self.observations["calibration"], self.observations["setting"])))

    @property
    def measures(self) -> list[str]:
        return [m for m in MEASURES if m in self.observations and self.observations[m].notna().any()]

    def coefficient(
        self, *, measure: str = "sigma", calibration: str = STOCK, setting: str = "main", n: int, config: str, position: int
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
        return [c["label"] for c in self.calibrations if _noop(self.coverage(), c["label"])]

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
            base = f"{_safe(r.calibration)}_{r.setting}_{r.measure}_n{r.n}_{r.config_key}_{r.coef}"
            out[base] = float(r.estimate)
            if r.position > 1:
                out[base + "_p"] = float(r.p)
        for (cal, setting, m), g in c[c["position"] > 1].groupby(["calibration", "setting", "measure"], sort=False):
            out[f"{_safe(cal)}_{setting}_{m}_mean_later_beta"] = float(g["estimate"].mean())
        for (cal, setting), g in self.observations.groupby(["calibration", "setting"], sort=False):
            out[f"{_safe(cal)}_{setting}_sigma_mean"] = float(g["sigma"].mean())
        cov = self.coverage()
        for label, g in cov[cov["calibrated_share"].notna()].groupby("calibration", sort=False):
            out[f"{_safe(label)}_calibrated_share"] = float(g["calibrated"].sum() / max(1, g["documents"].sum()))
        if self.has_fidelity:
            fid = self.fidelity()
            for r in fid.itertuples(index=False):
                for m in ("spread", "max_abs_beta", "margin", "other_cos", "recall", "drift"):
                    out[f"{_safe(r.calibration)}_{r.setting}_{m}_n{r.n}_{r.config_key}"] = float(getattr(r, m))
            for (cal, setting), g in fid.groupby(["calibration", "setting"], sort=False):
                for m in ("spread", "margin", "recall", "drift"):
                    out[f"{_safe(cal)}_{setting}_{m}_mean"] = float(g[m].mean())
        return out

    def headline_frame(self, positions=(2, 3), measure: str = "sigma") -> pd.DataFrame:
        """beta_p with marks per instance, one column per variant (main setting)."""
        c = self.coefficients
        c = c[(c["measure"] == measure) & (c["setting"] == "main") & (c["position"].isin(positions))]
        c = c.assign(cell=[_fmt(e, m, 3) for e, m in zip(c["estimate"], c["mark"])])
        hf = c.pivot_table(index=["n", "config", "coef"], columns="calibration", values="cell", aggfunc="first", sort=False)
        if len(hf):  # G: the segment sets (clusters) the marks of the row rest on
            g = c.groupby(["n", "config"])["clusters"].max()
            hf["G"] = [int(g.loc[(n, cfg)]) for n, cfg, _ in hf.index]
        return hf

    def few_clusters_message(self) -> str | None:
        """The G < 20 line (None if every instance has at least 20 segment sets)."""
        return few_clusters_message(self.coefficients)

    def inference_text(self) -> str:
        """What the p-values rest on (from the coefficients' inference labels)."""
        c = self.coefficients
        return describe_inference(c["inference"]) if "inference" in c and len(c) else ""

    # -- figures -----------------------------------------------------------------------------
    def figure(self, setting: str = "main", title: str = ""):
        """Mean sigma / tau per position with 95% intervals over segment sets; grid n x config; variants overlaid."""
        obs = self.observations
        rows, cols = sorted(obs["n"].unique()), self.configs
        colors = ["#1f4e9c", "#b2182b", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
        series = []
        variants = [(STOCK, "main")] + [(cal, setting) for cal, s in self.variants if cal != STOCK and s == setting]
        noop = set(self.noop_calibrations())
        for k, (cal, s) in enumerate(variants):
            d = obs[(obs["calibration"] == cal) & (obs["setting"] == s)]
            label = cal if s == "main" else f"{cal} (control)"
            if cal in noop:  # identical to stock: named in the legend, not drawn over the stock line
                label += f" — {NOOP_LABEL}, = stock"
            for m, style in (("sigma", "-"), ("tau", "--")):
                if m in self.measures:
                    data = pd.DataFrame({"row": d["n"], "col": d["config"], "x": d["position"], "value": d[m], "cluster": d["set_id"]})
                    series.append(
                        ProfileSeries(f"{'σ' if m == 'sigma' else 'τ'} {label}", data, colors[k % len(colors)], style, draw=cal not in noop)
                    )
        base = obs[(obs["calibration"] == STOCK) & (obs["setting"] == "main")]
        bars = pd.DataFrame({"row": base["n"], "col": base["config"], "x": base["position"], "bar": base["seg_tokens"]})
        return profile_grid(
            series, rows=rows, cols=cols, bars=bars, row_label=lambda n: f"n = {n}", ylabel="cosine similarity",
            bar_label="mean tokens", title=title,
        )  # fmt: skip

    def fidelity_figure(self, setting: str = "main", title: str = ""):
        """Profile spread of σ against own-segment recall@n, one point per variant and instance, stock marked."""
        fid = self.fidelity()
        fid = fid[(fid["setting"] == setting) | (fid["calibration"] == STOCK)]
        points = pd.DataFrame({
            "panel": [f"n = {n}, {c}" for n, c in zip(fid["n"], fid["config"])], "label": fid["calibration"],
            "x": fid["spread"], "y": fid["recall"], "reference": fid["calibration"] == STOCK,
        })  # fmt: skip
        return tradeoff_scatter(points, xlabel="σ profile spread (max - min over positions)", ylabel="own-segment recall@n", title=title)

    # -- persistence -------------------------------------------------------------------------
    def report_sections(self, figures: list[FigureRef] | None = None, extra_sections: list[Section] | None = None) -> list[Section]:
        from html import escape

        hf = self.headline_frame()
        few = self.few_clusters_message()
        inference_html = (f'<p class="inference">Inference: {escape(self.inference_text())}.</p>' if self.inference_text() else "") + (
            f'<p class="warning">Few clusters: {escape(few)}</p>' if few else ""
        )
        summary = Section(
            "Summary",
            "<p>Coefficients β<sub>p</sub> of the positional-fairness regression (σ, difference of position p to position 1; "
            f"negative = later segments under-represented); G: segment sets (clusters) per instance. {MARK_LEGEND}.</p>"
            + inference_html
            + to_html(Table("Headline: β2, β3 per instance", hf if len(hf) else pd.DataFrame(), name="headline"))
            + self._coverage_html(),
        )
        fig_section = Section(
            "Profiles",
            "<p>Mean σ (solid) and τ (dashed) per position with 95% intervals over segment sets; grey bars: mean segment "
            "length in tokens per position; rows: n, columns: language configuration.</p>",
            figures=[f for f in (figures or []) if f.alt != FIDELITY_ALT],
        )
        coef_tables = [t for t in self.tables() if t.name not in ("fidelity", "coverage")]
        tables = Section(
            "OLS tables",
            inference_html
            + "".join(
                f'<details class="detail"><summary>{escape(t.title)}</summary>{to_html(t)}</details>'
                if t.name.endswith("_detail")
                else to_html(t)
                for t in coef_tables
            ),
        )
        fidelity = []
        if self.has_fidelity:
            fidelity = [Section(
                "Fidelity",
                "<p>A flat σ profile can hide a collapse: if calibration makes every document embedding alike, each document "
                "is equally similar to its segments but no more than to anything else. The margin, own-segment recall and "
                "drift show what the flattening costs.</p>" + to_html(fidelity_table(self.fidelity(), self.model["name"])),
                figures=[f for f in (figures or []) if f.alt == FIDELITY_ALT],
            )]  # fmt: skip
        sampling = Section(
            "Documents",
            to_html(Table("Sampling per instance", pd.DataFrame(self.sampling).drop(columns=["notes"], errors="ignore"), name="sampling"))
            + "".join(f"<p>{n}</p>" for s in self.sampling for n in s.get("notes", [])),
        )
        params = Section(
            "Run parameters",
            "<h3>Model</h3>" + key_value_html(self.model) + "<h3>Corpus</h3>" + key_value_html(self.corpus)
            + "<h3>Settings</h3>" + key_value_html(self.settings)
            + "<h3>Calibrations</h3>" + "".join(f"<pre>{escape(json.dumps(c, sort_keys=True))}</pre>" for c in self.calibrations)
            + "<h3>Timings (s)</h3>" + key_value_html({k: f"{v:.1f}" for k, v in self.timings.items()}),
        )  # fmt: skip
        return [summary, fig_section, *fidelity, tables, sampling, *(extra_sections or []), params]

    def _coverage_html(self) -> str:
        """The calibrated-share table of the summary, with a warning line per calibration that left documents stock."""
        if not self.calibrations:
            return ""
        from html import escape

        notes = "".join(f'<p class="warning">{escape(m)}</p>' for m in coverage_messages(self.coverage()))
        return notes + to_html(coverage_table(self.coverage(), self.model["name"]))

    def save(self, out_dir, *, extra_sections: list[Section] | None = None, title: str | None = None) -> dict[str, Path]:
        """Write observations (Parquet), coefficients (CSV), tables (md/csv/tex), figures (png/pdf), report (HTML), run.json."""
        out = Path(out_dir)
        paths: dict[str, Path] = {}
        paths["observations"] = atomic_write_parquet(out / "observations.parquet", self.observations)
        paths["coefficients"] = atomic_write_text(out / "coefficients.csv", self.coefficients.to_csv(index=False))
        for t in self.tables():
            for kind, p in write_table(t, out / "tables").items():
                paths[f"table:{t.name}.{kind}"] = p
        figures = []
        settings = ["main"] + (["control"] if any(s == "control" for _, s in self.variants) else [])
        for setting in settings:
            title_fig = "calibrated documents vs stock standalone segments (control)" if setting == "control" else ""
            png = save_figure(self.figure(setting, title_fig), out / "figures" / f"profiles_{setting}")
            paths[f"figure:{setting}"] = out / "figures" / f"profiles_{setting}.png"
            cap = (
                "Semantic-fidelity control: calibrated documents against stock standalone segments, overlaid on the stock run."
                if setting == "control"
                else "Stock and calibrated runs (calibration applied to documents and standalone segments)."
            )
            figures.append(FigureRef(png, cap))
        if self.has_fidelity:
            png = save_figure(self.fidelity_figure(), out / "figures" / "fidelity")
            paths["figure:fidelity"] = out / "figures" / "fidelity.png"
            paths["fidelity"] = atomic_write_text(out / "fidelity.csv", self.fidelity().to_csv(index=False))
            figures.append(
                FigureRef(png, "σ profile spread against own-segment recall@n: one point per calibration, stock marked.", alt=FIDELITY_ALT)
            )
        hf = self.headline_frame()
        few = self.few_clusters_message()
        caption = f"{MARK_LEGEND}. G: segment sets (clusters). Inference: {self.inference_text()}." + (
            f" Few clusters: {few}" if few else ""
        )
        paths["headline"] = atomic_write_text(
            out / "headline.md", to_markdown(Table("β2, β3 (σ), stock vs calibrated", hf, caption, "headline")) if len(hf) else ""
        )
        paths["run"] = atomic_write_json(
            out / "run.json",
            {"model": self.model, "corpus": self.corpus, "settings": self.settings, "calibrations": self.calibrations,
             "sampling": self.sampling, "timings": self.timings, "headline": self.headline()},
        )  # fmt: skip
        paths["report"] = write_report(
            out / "report.html",
            title or f"Positional-fairness audit: {self.model['name']}",
            self.report_sections(figures, extra_sections),
            subtitle=f"corpus {self.corpus.get('name', '')} · {len(self.observations):,} observations",
        )
        return paths
