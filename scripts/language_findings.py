"""The README's language and position findings, as Markdown, from the output folders of ``posfair audit``.

Reads two language-grid audits (``--language-grid all``) and two position audits (``--n 3
--langs en --mixed de:en --by-family``), one of each per model, and prints:

1. the language effect on σ at equal position relative to English, per model: stock, stock
   length-adjusted, stock on the margin, and calibrated (from each audit's
   ``language_effects.csv``; marks as in posfair's tables);
2. each grid's summary per calibration (``tables/language_calibrations.csv``);
3. β_p (σ at position p minus σ at position 1) stock and calibrated, the change (calibrated
   minus stock on the same documents) and the share removed (1 - calibrated / stock), each with
   its 95 % interval, per document family and pooled (an audit run with ``--by-family``; else
   pooled only): the audit's own numbers (:func:`posfair.fairness.families.family_findings`),
   every interval t(G-1) under the more conservative of two-way set+topic and connected-component
   clustering, G the clusters really used.  "toward 0" only when the coefficient keeps its sign
   and the change's interval lies on the side of 0 (:func:`posfair.fairness.families.change_direction`);
4. with two position audits, the second model's stock β_p over the first's (Fieller's interval,
   independent audits), and per model Cochran's Q across the families;
5. from each grid audit's observations, per document family (a grid run ``--by-family``) and pooled:
   the language effects (stock, length-adjusted, margin, calibrated) and their change under
   calibration (calibrated minus stock on the same later segments, one joint fit), each with its
   95 % interval under the audit's default clustering (per term the wider of two-way and
   component clustering, G and the clustering named; :func:`language_effects_by_family`);
6. the grid summary of 2. per family and pooled (β2 of every instance refitted per family).

    python scripts/language_findings.py --grid "multilingual-e5-small=grid-e5" --grid "all-MiniLM-L6-v2=grid-minilm" \\
        --positions "multilingual-e5-small=pos-e5" --positions "all-MiniLM-L6-v2=pos-minilm"
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from posfair.fairness.analysis import fit_all
from posfair.fairness.documents import config_label
from posfair.fairness.experiment import STOCK_LABEL
from posfair.fairness.families import family_findings, heterogeneity, interval_of, model_ratio
from posfair.fairness.language import fit_language_ols, language_design, language_effects
from posfair.fairness.language_tables import calibration_effect_table
from posfair.stats.clusters import joint_ols
from posfair.stats.inference import FewClustersWarning, significance_mark


def _pairs(values: list[str]) -> list[tuple[str, Path]]:
    out = []
    for v in values:
        name, _, folder = v.partition("=")
        out.append((name, Path(folder)))
    return out


def _cell(row) -> str:
    mark = significance_mark(float(row["p"])) if pd.notna(row["p"]) else ""
    return f"{row['estimate']:+.3f}{(' ' + mark) if mark else ''}"


def language_table(grids: list[tuple[str, Path]]) -> str:
    cols, frames = [], []
    for name, folder in grids:
        eff = pd.read_csv(folder / "language_effects.csv")
        eff = eff[(eff["n"] == 3) & (eff["kind"] == "later")]
        cal = sorted(set(eff["calibration"]) - {"stock"})[0]
        picks = {
            "stock": (eff["calibration"] == "stock") & (eff["measure"] == "sigma") & ~eff["length_adjusted"],
            "length-adj.": (eff["calibration"] == "stock") & (eff["measure"] == "sigma") & eff["length_adjusted"],
            "margin": (eff["calibration"] == "stock") & (eff["measure"] == "margin") & ~eff["length_adjusted"],
            "calibrated": (eff["calibration"] == cal) & (eff["measure"] == "sigma") & ~eff["length_adjusted"],
        }
        for label, mask in picks.items():
            sub = eff[mask & ~eff["is_reference"]].set_index("level")
            frames.append(sub.apply(_cell, axis=1).rename(f"{name}: {label}"))
            cols.append(f"{name}: {label}")
    table = pd.concat(frames, axis=1)
    lines = ["| language | " + " | ".join(cols) + " |", "|:--|" + "--:|" * len(cols)]
    for lang, row in table.iterrows():
        lines.append(f"| {lang} | " + " | ".join(row.fillna("")) + " |")
    return "\n".join(lines)


def grid_summary(grids: list[tuple[str, Path]]) -> str:
    lines = []
    for name, folder in grids:
        d = pd.read_csv(folder / "tables" / "language_calibrations.csv")
        for _, r in d.iterrows():
            lines.append(
                f"| {name} | {r['calibration']} | {r['mean β2 monolingual']:+.3f} | {r['mean β2 mixed']:+.3f} | "
                f"{r['mean |β2| (all cells)']:.3f} | {r['significant cells']} | {r['language-effect spread (max - min)']:.3f} |"
            )
    head = [
        "| model | calibration | mean β2 mono | mean β2 mixed | mean abs β2 | cells p < .05 | language spread |",
        "|:--|:--|--:|--:|--:|--:|--:|",
    ]
    return "\n".join(head + lines)


def _observations(folder: Path) -> pd.DataFrame:
    return pd.read_parquet(folder / "observations.parquet")


def _documents(config: str, n: int) -> str:
    """The documents' configuration by its one name (``en``, ``[de, en, en]``), as posfair's tables write it."""
    return config_label(config, n)


def findings(folders: list[tuple[str, Path]]) -> dict[str, pd.DataFrame]:
    """Per model, the audit's :func:`~posfair.fairness.families.family_findings` of its position audit."""
    return {name: family_findings(_observations(folder)) for name, folder in folders}


def position_table(folders: list[tuple[str, Path]], found: dict[str, pd.DataFrame] | None = None) -> str:
    """β_p stock and calibrated, the change with its interval and direction, and the share removed, per model,
    documents, n, β and family (``pooled`` over the families; the only row of an audit not run by family)."""
    found = found if found is not None else findings(folders)
    lines = [
        "| model | documents | n | β | family | stock | calibrated | change [95 % interval] | share removed [95 %] | G (clusters) |",
        "|:--|:--|--:|:--|:--|--:|--:|:--|:--|:--|",
    ]
    for name, _ in folders:
        f = found[name]
        f = f.sort_values(
            ["n", "config", "position"], key=lambda c: c != "en" if c.name == "config" else c, kind="stable"
        )
        for _, r in f.iterrows():
            share = "" if not np.isfinite(r["share_estimate"]) else (
                f"{100 * r['share_estimate']:.0f} % "
                + (f"[{100 * r['share_ci_low']:.0f}, {100 * r['share_ci_high']:.0f}]"
                   if np.isfinite(r["share_ci_low"]) else "[unbounded]")
                + ("" if r["share_G"] == r["change_G"] else f" (G={r['share_G']})")
            )  # fmt: skip
            lines.append(
                f"| {name} | {_documents(r['config'], r['n'])} | {r['n']} | β{r['position']} | {r['family']} | "
                f"{r['stock_estimate']:+.3f} | {r['calibrated_estimate']:+.3f} | {r['change_estimate']:+.3f} "
                f"[{r['change_ci_low']:+.3f}, {r['change_ci_high']:+.3f}] {r['direction']} | {share} | "
                f"{r['change_G']} ({r['change_clusters'].split(' (')[0]}) |"
            )
    return "\n".join(lines)


def ratio_table(folders: list[tuple[str, Path]], found: dict[str, pd.DataFrame] | None = None) -> str:
    """How many times larger the second model's stock β_p is than the first's (same documents, n, β, family):
    Fieller's interval for two independent audits (:func:`~posfair.fairness.families.model_ratio`)."""
    found = found if found is not None else findings(folders)
    (a_name, _), (b_name, _) = folders[:2]
    keys = ["n", "config", "family", "position"]
    both = found[a_name].merge(found[b_name], on=keys, suffixes=("_a", "_b"))
    lines = [
        f"| documents | n | β | family | {a_name} | {b_name} | {b_name} / {a_name} [95 %] |",
        "|:--|--:|:--|:--|--:|--:|:--|",
    ]
    for _, r in both.iterrows():
        a = interval_of({k[:-2]: v for k, v in r.items() if k.endswith("_a")}, "stock")
        b = interval_of({k[:-2]: v for k, v in r.items() if k.endswith("_b")}, "stock")
        ratio = model_ratio(b, a)
        inner = f"{ratio.ci_low:.1f}, {ratio.ci_high:.1f}" if ratio.bounded else "unbounded"
        lines.append(
            f"| {_documents(r['config'], r['n'])} | {r['n']} | β{r['position']} | {r['family']} | {a.estimate:+.3f} | "
            f"{b.estimate:+.3f} | {ratio.estimate:.1f} [{inner}] |"
        )
    return "\n".join(lines)


def heterogeneity_lines(folders: list[tuple[str, Path]], found: dict[str, pd.DataFrame] | None = None) -> str:
    """Cochran's Q across the families per model, documents, n, β and quantity."""
    found = found if found is not None else findings(folders)
    lines = [
        "| model | documents | n | β | quantity | Q | p | I² | per family |",
        "|:--|:--|--:|:--|:--|--:|--:|--:|:--|",
    ]
    for name, _ in folders:
        for _, r in heterogeneity(found[name]).iterrows():
            lines.append(
                f"| {name} | {_documents(r['config'], r['n'])} | {r['n']} | β{r['position']} | {r['quantity']} | {r['Q']:.2f} | "
                f"{r['p']:.3g} | {100 * r['I2']:.0f} % | {r['families']} |"
            )
    return "\n".join(lines)


def _ci(x) -> str:
    """``+0.019 [+0.010, +0.028]`` of an estimate and its interval (``unbounded`` where it is)."""
    lo, hi = x["ci_low"], x["ci_high"]
    inner = f"{lo:+.3f}, {hi:+.3f}" if np.isfinite(lo) and np.isfinite(hi) else "unbounded"
    return f"{x['estimate']:+.3f} [{inner}]"


def _families(obs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each document family's observations (an audit run ``--by-family``), then all of them as ``pooled``."""
    fams = sorted(f for f in obs["family"].astype(str).unique() if f) if "family" in obs else []
    return [(f, obs[obs["family"].astype(str) == f]) for f in fams] + [("pooled", obs)]


def language_effects_by_family(obs: pd.DataFrame, n: int = 3) -> pd.DataFrame:
    """Per family and pooled, per later language (reference English): the pooled language regression's effect stock,
    stock length-adjusted, stock on the margin and calibrated, and the change (calibrated minus stock on the same
    later segments), each with its 95 % interval under the audit's default clustering (per term the wider of two-way
    set+topic and connected-component clustering, :func:`posfair.stats.clusters.fit_clustered`; the change from
    the joint fit of both, :func:`posfair.stats.clusters.joint_ols`), G and the clustering used."""
    obs = obs[(obs["setting"] == "main") & (obs["n"] == n)]
    cal = sorted(set(obs["calibration"]) - {STOCK_LABEL})[0]
    rows = []
    for family, o in _families(obs):
        fits = {
            "stock": fit_language_ols(o, n=n),
            "length-adj.": fit_language_ols(o, n=n, control_length=True),
            "margin": fit_language_ols(o, n=n, measure="margin"),
            "calibrated": fit_language_ols(o, n=n, calibration=cal),
        }
        # the change: stock and calibrated σ of the same later segments on one design, their joint covariance
        later = o[o["position"] >= 2]
        keys = ["doc_id", "position"]
        paired = later[later["calibration"] == STOCK_LABEL].merge(
            later[later["calibration"] == cal][[*keys, "sigma"]], on=keys, suffixes=("", "_cal"), validate="1:1"
        )
        X, names = language_design(paired, n, fits["stock"].reference, False, fits["stock"].lead_controls)
        joint = joint_ols(X, paired[["sigma", "sigma_cal"]].to_numpy(), paired["set_id"], paired["topic"])
        for j, term in enumerate(names):
            if not term.startswith("later:"):
                continue
            row = {"family": family, "language": term.split(":", 1)[1]}
            for what, fit in fits.items():
                k = fit.names.index(term)
                row[what] = {
                    "estimate": fit.params[k], "p": fit.pvalues[k], "ci_low": fit.ci[k, 0], "ci_high": fit.ci[k, 1],
                    "G": int(fit.G[k]), "clusters": fit.clusters_used[k], "kind": fit.kinds_used[k],
                }  # fmt: skip
            change = joint.linear(joint.coef(1, j) - joint.coef(0, j))
            row["change"] = change.to_dict()
            rows.append(row)
    return pd.DataFrame(rows)


def language_family_table(grids: list[tuple[str, Path]]) -> str:
    """Markdown: per model, later language and family, the language effects and the change with their intervals."""
    lines = [
        "| model | language | family | stock | length-adj. | margin | calibrated | change (cal. − stock) | G (clusters) |",
        "|:--|:--|:--|:--|:--|:--|:--|:--|:--|",
    ]
    for name, folder in grids:
        eff = language_effects_by_family(_observations(folder))
        for _, r in eff.sort_values(["language"], kind="stable").iterrows():
            cells = [_ci(r[w]) for w in ("stock", "length-adj.", "margin", "calibrated", "change")]
            gs = dict.fromkeys(f"{r[w]['G']} {r[w]['kind']}" for w in ("stock", "change"))
            lines.append(f"| {name} | {r['language']} | {r['family']} | " + " | ".join(cells) + f" | {', '.join(gs)} |")
    return "\n".join(lines)


def grid_summary_by_family(grids: list[tuple[str, Path]]) -> str:
    """Markdown: the grid summary (mean β2 monolingual and mixed, mean |β2|, cells with p < 0.05 under the audit's
    default clustering, the spread of the language effects) per model, family and calibration."""
    lines = [
        "| model | family | calibration | mean β2 mono | mean β2 mixed | mean abs β2 | cells p < .05 | language spread |",
        "|:--|:--|:--|--:|--:|--:|--:|--:|",
    ]
    for name, folder in grids:
        obs = _observations(folder)
        obs = obs[obs["setting"] == "main"]
        for family, o in _families(obs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FewClustersWarning)
                coefs = fit_all(o, ["sigma"])
            eff = language_effects(o)
            for _, r in calibration_effect_table(coefs, eff, model=name).frame.reset_index().iterrows():
                lines.append(
                    f"| {name} | {family} | {r['calibration']} | {r['mean β2 monolingual']} | {r['mean β2 mixed']} | "
                    f"{r['mean |β2| (all cells)']} | {r['significant cells']} | {r['language-effect spread (max - min)']} |"
                )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=FOLDER", help="a --language-grid audit folder")
    ap.add_argument("--positions", action="append", default=[], metavar="NAME=FOLDER", help="a position audit folder")
    args = ap.parse_args()
    if args.grid:
        print(language_table(_pairs(args.grid)), end="\n\n")
        print(grid_summary(_pairs(args.grid)), end="\n\n")
        print(language_family_table(_pairs(args.grid)), end="\n\n")
        print(grid_summary_by_family(_pairs(args.grid)), end="\n\n")
    if args.positions:
        folders = _pairs(args.positions)
        found = findings(folders)
        print(position_table(folders, found), end="\n\n")
        if len(folders) >= 2:
            print(ratio_table(folders, found), end="\n\n")
        print(heterogeneity_lines(folders, found))


if __name__ == "__main__":
    main()
