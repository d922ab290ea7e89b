"""The audit result: observations, OLS coefficients, tables, figures and the HTML report.

``AuditResult.observations`` has one row per (variant, document, position) with
the ids needed to join further measures later (``doc_id``, ``set_id``,
``permutation``, ``position``, ``segment_id``, ``lang``, ``calibration``,
``setting``).  Further per-observation measures become extra columns;
further report parts are passed as ``extra_sections`` to :meth:`AuditResult.report_sections`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.fairness.experiment import MEASURES, STOCK
from posfair.fairness.ols import MARK_LEGEND, fit_position_ols
from posfair.io import atomic_write_json, atomic_write_parquet, atomic_write_text
from posfair.report.html import FigureRef, Section, key_value_html, write_report
from posfair.report.plots import ProfileSeries, profile_grid, save_figure
from posfair.report.tables import Table, to_html, to_markdown, write_table

__all__ = ["AuditResult", "fit_all", "coefficient_table", "MEASURE_TITLES"]

MEASURE_TITLES = {
    "sigma": "positional fairness (sigma = cos(document, standalone segment))",
    "tau": "information retention (tau = cos(standalone, contextualised segment))",
}
GROUP = ["calibration", "setting", "measure", "n", "config"]


def fit_all(observations: pd.DataFrame, measures=MEASURES) -> pd.DataFrame:
    """OLS per (calibration, setting, measure, n, config): long table of coefficients."""
    rows = []
    keys = ["calibration", "setting", "n", "config"]
    for key, g in observations.groupby(keys, sort=False):
        for m in measures:
            y = g[m].to_numpy(dtype=float)
            if not np.isfinite(y).any():
                continue
            fit = fit_position_ols(y, g["position"].to_numpy(), g["set_id"].to_numpy(), n=int(key[2]))
            f = fit.to_frame()
            for name, val in zip(keys, key):
                f[name] = val
            f["measure"] = m
            f["config_key"] = g["config_key"].iloc[0]
            rows.append(f)
    if not rows:
        return pd.DataFrame(columns=GROUP + ["coef", "position", "estimate", "se", "p", "mark", "nobs", "clusters", "config_key"])
    out = pd.concat(rows, ignore_index=True)
    return out[GROUP + ["config_key", "coef", "position", "estimate", "se", "p", "mark", "nobs", "clusters"]]


def _fmt(estimate: float, mark: str, digits: int) -> str:
    s = f"{estimate:.{digits}f}"
    if s.startswith("-") and float(s) == 0:
        s = s[1:]
    return s + (f" {mark}" if mark else "")


def coefficient_table(coefs: pd.DataFrame, *, model: str, measure: str, calibration: str, setting: str, configs: list[str], digits: int = 3) -> Table:
    """The paper's Table 1 layout: rows (n, beta_k), columns language configurations."""
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
    frame = pd.DataFrame(cells, columns=configs, index=pd.MultiIndex.from_tuples(index, names=["n", "coefficient"]) if index else None)
    variant = calibration if setting == "main" else f"{calibration}, control: calibrated documents vs stock segments"
    stem = f"{measure}_{_safe(calibration)}_{setting}"
    return Table(
        title=f"OLS coefficients, {MEASURE_TITLES[measure].split(' (')[0]} ({model}, {variant})",
        frame=frame,
        caption=(
            f"{MEASURE_TITLES[measure]}. OLS on position dummies (position 1 = baseline), standard errors clustered "
            f"by segment set. Statistical significance: {MARK_LEGEND}."
        ),
        name=stem,
    )


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

    def coefficient(self, *, measure: str = "sigma", calibration: str = STOCK, setting: str = "main", n: int, config: str, position: int) -> pd.Series:
        c = self.coefficients
        hit = c[(c["measure"] == measure) & (c["calibration"] == calibration) & (c["setting"] == setting) & (c["n"] == n) & (c["config"] == config) & (c["position"] == position)]
        if not len(hit):
            raise KeyError(f"no coefficient for {measure}/{calibration}/{setting}/n={n}/{config}/position {position}")
        return hit.iloc[0]

    def tables(self) -> list[Table]:
        out = []
        for m in self.measures:
            for cal, setting in self.variants:
                if setting == "control" and m != "sigma":
                    continue
                out.append(coefficient_table(self.coefficients, model=self.model["name"], measure=m, calibration=cal, setting=setting, configs=self.configs))
        return out

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
        return out

    def headline_frame(self, positions=(2, 3), measure: str = "sigma") -> pd.DataFrame:
        """beta_p with marks per instance, one column per variant (main setting)."""
        c = self.coefficients
        c = c[(c["measure"] == measure) & (c["setting"] == "main") & (c["position"].isin(positions))]
        c = c.assign(cell=[_fmt(e, m, 3) for e, m in zip(c["estimate"], c["mark"])])
        return c.pivot_table(index=["n", "config", "coef"], columns="calibration", values="cell", aggfunc="first", sort=False)

    # -- figures -----------------------------------------------------------------------------
    def figure(self, setting: str = "main", title: str = ""):
        """Mean sigma / tau per position with 95% intervals over segment sets; grid n x config; variants overlaid."""
        obs = self.observations
        rows, cols = sorted(obs["n"].unique()), self.configs
        colors = ["#1f4e9c", "#b2182b", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
        series = []
        variants = [(STOCK, "main")] + [(cal, setting) for cal, s in self.variants if cal != STOCK and s == setting]
        for k, (cal, s) in enumerate(variants):
            d = obs[(obs["calibration"] == cal) & (obs["setting"] == s)]
            label = cal if s == "main" else f"{cal} (control)"
            for m, style in (("sigma", "-"), ("tau", "--")):
                if m in self.measures:
                    data = pd.DataFrame({"row": d["n"], "col": d["config"], "x": d["position"], "value": d[m], "cluster": d["set_id"]})
                    series.append(ProfileSeries(f"{'σ' if m == 'sigma' else 'τ'} {label}", data, colors[k % len(colors)], style))
        base = obs[(obs["calibration"] == STOCK) & (obs["setting"] == "main")]
        bars = pd.DataFrame({"row": base["n"], "col": base["config"], "x": base["position"], "bar": base["seg_tokens"]})
        return profile_grid(
            series, rows=rows, cols=cols, bars=bars, row_label=lambda n: f"n = {n}", ylabel="cosine similarity",
            bar_label="mean tokens", title=title,
        )  # fmt: skip

    # -- persistence -------------------------------------------------------------------------
    def report_sections(self, figures: list[FigureRef] | None = None, extra_sections: list[Section] | None = None) -> list[Section]:
        hf = self.headline_frame()
        summary = Section(
            "Summary",
            "<p>Coefficients β<sub>p</sub> of the positional-fairness regression (σ, difference of position p to position 1; "
            f"negative = later segments under-represented). {MARK_LEGEND}.</p>"
            + to_html(Table("Headline: β2, β3 per instance", hf if len(hf) else pd.DataFrame(), name="headline")),
        )
        fig_section = Section(
            "Profiles",
            "<p>Mean σ (solid) and τ (dashed) per position with 95% intervals over segment sets; grey bars: mean segment "
            "length in tokens per position; rows: n, columns: language configuration.</p>",
            figures=figures or [],
        )
        tables = Section("OLS tables", "".join(to_html(t) for t in self.tables()))
        sampling = Section(
            "Documents",
            to_html(Table("Sampling per instance", pd.DataFrame(self.sampling).drop(columns=["notes"], errors="ignore"), name="sampling"))
            + "".join(f"<p>{n}</p>" for s in self.sampling for n in s.get("notes", [])),
        )
        from html import escape

        params = Section(
            "Run parameters",
            "<h3>Model</h3>" + key_value_html(self.model) + "<h3>Corpus</h3>" + key_value_html(self.corpus)
            + "<h3>Settings</h3>" + key_value_html(self.settings)
            + "<h3>Calibrations</h3>" + "".join(f"<pre>{escape(json.dumps(c, sort_keys=True))}</pre>" for c in self.calibrations)
            + "<h3>Timings (s)</h3>" + key_value_html({k: f"{v:.1f}" for k, v in self.timings.items()}),
        )  # fmt: skip
        return [summary, fig_section, tables, sampling, *(extra_sections or []), params]

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
        hf = self.headline_frame()
        paths["headline"] = atomic_write_text(out / "headline.md", to_markdown(Table("β2, β3 (σ), stock vs calibrated", hf, MARK_LEGEND, "headline")) if len(hf) else "")
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

