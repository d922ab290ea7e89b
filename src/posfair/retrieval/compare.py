"""Every setting against stock on the same queries, with paired bootstrap intervals.

For each evaluated setting other than stock: the change of aggregate nDCG@10 (mean of the
per-query differences, resampled over queries) and of Harm (the harmonic mean of the group
means, queries resampled within each positional group), both x100, and of PSI (1 - min / max
of the group means, same resampling; lower = less sensitive to the answer's position), each
with a 95 % percentile interval from :mod:`posfair.stats.intervals` (seeded).  A setting is called
higher or lower than stock only when its interval excludes 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from posfair.report.tables import Table
from posfair.retrieval.evaluator import RetrievalResult
from posfair.retrieval.metrics import harmonic_mean, psi
from posfair.stats.intervals import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, grouped_interval, paired_mean_interval

__all__ = ["differences_from_stock", "differences_table", "harm_change", "verdict"]


def verdict(low: float, high: float) -> str:
    """``higher`` / ``lower`` when the interval excludes 0, else ``no difference shown``."""
    if low > 0:
        return "higher"
    if high < 0:
        return "lower"
    return "no difference shown"


def harm_change(groups: list[np.ndarray]) -> float:
    """Harm(setting) - Harm(stock) from per-group arrays of (stock, setting) nDCG pairs (the rule of this module's
    comparisons and of the tuner's retrieval objective, :meth:`posfair.tuning.RetrievalObjective.score_effect`)."""
    return harmonic_mean([g[:, 1].mean() for g in groups]) - harmonic_mean([g[:, 0].mean() for g in groups])


def _psi_change(groups: list[np.ndarray]) -> float:
    """PSI(setting) - PSI(stock) from per-group arrays of (stock, setting) nDCG pairs."""
    return psi([g[:, 1].mean() for g in groups]) - psi([g[:, 0].mean() for g in groups])


def differences_from_stock(results: Sequence[RetrievalResult]) -> pd.DataFrame:
    """One row per evaluated non-stock setting: ``setting, queries, d_ndcg, d_ndcg_low, d_ndcg_high, ndcg_verdict``
    and, when the results record their groups, ``d_harm, d_harm_low, d_harm_high, harm_verdict`` (x100) and
    ``d_psi, d_psi_low, d_psi_high, psi_verdict`` (PSI's own scale, 0..1)."""
    stock = next((r for r in results if r.method == "stock" and r.evaluated), None)
    if stock is None:
        return pd.DataFrame()
    rows = []
    for r in results:
        if r is stock or not r.evaluated or r.noop:
            continue
        if list(r.query_ids) != list(stock.query_ids):
            raise ValueError(f"{r.setting}: not evaluated on the same queries as stock; no paired comparison")
        diff = r.ndcg - stock.ndcg
        low, high = paired_mean_interval(diff)
        row = {
            "setting": r.setting,
            "queries": len(diff),
            "d_ndcg": 100 * float(diff.mean()),
            "d_ndcg_low": 100 * low,
            "d_ndcg_high": 100 * high,
            "ndcg_verdict": verdict(low, high),
        }
        if r.group_queries and r.groups:
            pairs = [np.column_stack([stock.ndcg[idx], r.ndcg[idx]]) for idx in r.group_queries.values() if idx]
            h_low, h_high = grouped_interval(pairs, harm_change)
            row |= {
                "d_harm": 100 * (r.metrics["harm"] - stock.metrics["harm"]),
                "d_harm_low": 100 * h_low,
                "d_harm_high": 100 * h_high,
                "harm_verdict": verdict(h_low, h_high),
            }
            p_low, p_high = grouped_interval(pairs, _psi_change)
            row |= {
                "d_psi": _psi_change(pairs),
                "d_psi_low": p_low,
                "d_psi_high": p_high,
                "psi_verdict": verdict(p_low, p_high),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def differences_table(results: Sequence[RetrievalResult]) -> Table | None:
    """:func:`differences_from_stock` formatted for the terminal and the results folder (None without stock)."""
    d = differences_from_stock(results)
    if not len(d):
        return None
    name = results[0].benchmark
    cells = {"setting": d["setting"]}
    cells["ΔnDCG@10 [95 % interval]"] = [
        f"{r.d_ndcg:+.2f} [{r.d_ndcg_low:+.2f}, {r.d_ndcg_high:+.2f}]" for r in d.itertuples()
    ]
    cells["nDCG@10 vs stock"] = d["ndcg_verdict"]
    if "d_harm" in d:
        cells["ΔHarm [95 % interval]"] = [
            "" if pd.isna(r.d_harm) else f"{r.d_harm:+.2f} [{r.d_harm_low:+.2f}, {r.d_harm_high:+.2f}]"
            for r in d.itertuples()
        ]
        cells["Harm vs stock"] = d["harm_verdict"].fillna("")
        cells["ΔPSI [95 % interval]"] = [
            "" if pd.isna(r.d_psi) else f"{r.d_psi:+.3f} [{r.d_psi_low:+.3f}, {r.d_psi_high:+.3f}]"
            for r in d.itertuples()
        ]
        cells["PSI vs stock"] = d["psi_verdict"].fillna("")
    frame = pd.DataFrame(cells).set_index("setting")
    return Table(
        f"{name} - change from stock (nDCG@10, Harm x100; PSI 0-1, lower = less position-sensitive) with paired 95 % "
        "bootstrap intervals",
        frame,
        f"Paired bootstrap over the {int(d['queries'].iloc[0])} queries (Harm, PSI: resampled within each positional group), "
        f"{BOOTSTRAP_DRAWS} draws, seed {BOOTSTRAP_SEED}; a setting is called higher or lower only when its interval "
        "excludes 0.",
        "table_differences",
    )
