"""The README's language and position findings, as Markdown, from the output folders of ``posfair audit``.

Reads two language-grid audits (``--language-grid all``) and two position audits (``--n 3,4
--langs en --mixed de:en``), one of each per model, and prints:

1. the language effect on σ at equal position relative to English, per model: stock, stock
   length-adjusted, stock on the margin, and calibrated (from each audit's
   ``language_effects.csv``; marks as in posfair's tables);
2. each grid's summary per calibration (``tables/language_calibrations.csv``);
3. β_p (σ at position p minus σ at position 1) stock and calibrated, and the change with a
   95 % interval: per segment set, the calibrated minus the stock β_p (the design is balanced:
   every set contributes every ordering, so β_p is the mean over sets of the set's own
   difference of means), then a t interval with G-1 degrees of freedom over the G sets, the
   same clusters and t(G-1) as the audit's inference.  A change is called a change only when
   its interval excludes 0.

    python scripts/language_findings.py --grid "multilingual-e5-small=grid-e5" --grid "all-MiniLM-L6-v2=grid-minilm" \\
        --positions "multilingual-e5-small=pos-e5" --positions "all-MiniLM-L6-v2=pos-minilm"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from posfair.fairness.ols import fit_position_ols, significance_mark


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


def _set_betas(obs: pd.DataFrame, n: int) -> pd.DataFrame:
    """Per segment set, σ at position p minus σ at position 1 (the set's own means), p = 2..n."""
    means = obs.groupby(["set_id", "position"])["sigma"].mean().unstack("position")
    return pd.DataFrame({p: means[p] - means[1] for p in range(2, n + 1)})


def position_table(folders: list[tuple[str, Path]]) -> str:
    lines = [
        "| model | documents | n | β | stock | calibrated | change [95 % interval] | G |",
        "|:--|:--|--:|:--|--:|--:|:--|--:|",
    ]
    for name, folder in folders:
        obs = pd.read_parquet(
            folder / "observations.parquet", columns=["calibration", "n", "config", "set_id", "position", "sigma"]
        )
        cal = sorted(set(obs["calibration"]) - {"stock"})[0]
        groups = sorted(obs.groupby(["n", "config"]), key=lambda g: (g[0][0], g[0][1] != "en", g[0][1]))
        for (n, config), part in groups:
            stock = part[part["calibration"] == "stock"]
            calib = part[part["calibration"] == cal]
            bs, bc = _set_betas(stock, n), _set_betas(calib, n)
            fit = fit_position_ols(stock["sigma"], stock["position"], stock["set_id"], n, warn=False)
            np.testing.assert_allclose(
                fit.params[1:], bs.mean().to_numpy(), atol=1e-12
            )  # balanced: OLS = mean over sets
            diff = (bc - bs).dropna()
            g = len(diff)
            half = stats.t.ppf(0.975, g - 1) * diff.std(ddof=1) / np.sqrt(g)
            for p in range(2, n + 1):
                m = diff[p].mean()
                lo, hi = m - half[p], m + half[p]
                what = (
                    "" if lo <= 0 <= hi else (" toward 0" if abs(bc[p].mean()) < abs(bs[p].mean()) else " away from 0")
                )
                label = "English" if config == "en" else "German first, then English"
                lines.append(
                    f"| {name} | {label} | {n} | β{p} | {bs[p].mean():+.3f} | {bc[p].mean():+.3f} | "
                    f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{what} | {g} |"
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
    if args.positions:
        print(position_table(_pairs(args.positions)))


if __name__ == "__main__":
    main()
