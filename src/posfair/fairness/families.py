"""Findings that hold on every document family: per-family and pooled coefficients, their change under calibration,
the share removed, and how much the families disagree.

An audit run with a family field (``posfair audit --by-family``; ``AuditSettings(family_field="source")``: the
bundled corpus's FAQ and installation guide) draws every instance once per family, so each family's segment sets
hold only its own topics.  Per (calibration, n, configuration, position p >= 2) and per family, and pooled over the
families, :func:`family_findings` gives

* β_p stock and calibrated (σ at position p minus σ at position 1),
* the change (calibrated minus stock, paired: the same documents) and its direction (:func:`change_direction`),
* the share removed, ``1 - β_p calibrated / β_p stock``, with Fieller's interval,

every interval from one joint fit of stock and calibrated σ on the position dummies
(:func:`posfair.stats.clusters.joint_ols`), under the more conservative of component and two-way clustering (the
row says which, and its G).  :func:`heterogeneity` tests whether the families agree: Cochran's Q on the per-family
estimates weighted by their inverse squared standard errors, ``Q ~ chi2(k - 1)`` for k families, with
``I² = max(0, (Q - (k - 1)) / Q)``.

Computing only: the tables, the report section and ``families.json`` are :mod:`posfair.fairness.family_report`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from posfair.fairness.experiment import STOCK_LABEL
from posfair.stats.clusters import Interval, fieller, joint_ols
from posfair.stats.position_ols import position_design

__all__ = [
    "POOLED",
    "TOWARD",
    "AWAY",
    "FLIPPED",
    "NO_CHANGE",
    "change_direction",
    "families_of",
    "paired_observations",
    "family_findings",
    "heterogeneity",
    "cochran_q",
    "model_ratio",
    "interval_of",
]

POOLED = "pooled"
TOWARD, AWAY, FLIPPED, NO_CHANGE = "toward 0", "away from 0", "past 0 (sign flipped)", "no change"
KEYS = ["calibration", "n", "config", "family", "position"]


def change_direction(stock: float, calibrated: float, ci_low: float, ci_high: float) -> str:
    """Where calibration moved a coefficient, read from the change's interval (calibrated minus stock).

    ``"no change"`` when the interval holds 0 (or is not finite); ``"past 0 (sign flipped)"`` when the calibrated
    coefficient has the other sign (however small: a flip is not a move toward 0); ``"toward 0"`` only when the sign
    is kept *and* the whole interval lies on the side that points to 0 (above 0 for a negative coefficient, below for
    a positive one); ``"away from 0"`` otherwise.
    """
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)) or ci_low <= 0 <= ci_high:
        return NO_CHANGE
    if stock * calibrated < 0:
        return FLIPPED
    if (stock < 0 and ci_low > 0) or (stock > 0 and ci_high < 0):
        return TOWARD
    return AWAY


def families_of(observations: pd.DataFrame) -> list[str]:
    """The document families of an audit's observations (``[]`` when it was not run by family)."""
    if "family" not in observations:
        return []
    return sorted(f for f in observations["family"].dropna().astype(str).unique() if f)


def paired_observations(observations: pd.DataFrame, calibration: str | None, measure: str = "sigma") -> pd.DataFrame:
    """Stock and ``calibration`` rows of the main setting side by side: one row per (document, position) with
    ``stock`` and ``calibrated`` (None: stock only, ``calibrated`` NaN).  Every document must have both."""
    o = observations[observations["setting"] == "main"]
    if "family" not in o:
        o = o.assign(family="")
    cols = ["n", "config", "family", "doc_id", "set_id", "topic", "position"]
    stock = o[o["calibration"] == STOCK_LABEL][[*cols, measure]].rename(columns={measure: "stock"})
    if calibration is None:
        return stock.assign(calibrated=np.nan)
    cal = o[o["calibration"] == calibration][["doc_id", "position", measure]].rename(columns={measure: "calibrated"})
    both = stock.merge(cal, on=["doc_id", "position"], how="outer", indicator=True)
    lone = both[both["_merge"] != "both"]
    if len(lone):
        raise ValueError(
            f"{len(lone)} (document, position) observations of {calibration} and stock are unpaired "
            f"(first: {lone['doc_id'].iloc[0]}): the change needs both on the same documents"
        )
    return both.drop(columns="_merge")


def _fit_rows(g: pd.DataFrame, n: int, paired: bool) -> list[dict[str, Any]]:
    X = position_design(g["position"].to_numpy(), n)
    Y = g[["stock", "calibrated"]].to_numpy() if paired else g[["stock"]].to_numpy()
    fit = joint_ols(X, Y, g["set_id"].to_numpy(), g["topic"].to_numpy())
    st = fit.variants["component"][0]
    rows = []
    for p in range(2, n + 1):
        j = p - 1
        row: dict[str, Any] = {
            "position": p,
            "coef": f"beta_{p}",
            "sets": st.n_sets,
            "topics": st.n_topics,
            "components": st.n_components,
            "shared_topics": st.shared_topics,
            "nobs": len(g),
        }
        row |= fit.linear(fit.coef(0, j)).to_dict("stock_")
        if paired:
            change = fit.linear(fit.coef(1, j) - fit.coef(0, j))
            row |= fit.linear(fit.coef(1, j)).to_dict("calibrated_")
            row |= change.to_dict("change_")
            row["direction"] = change_direction(
                row["stock_estimate"], row["calibrated_estimate"], change.ci_low, change.ci_high
            )
            row |= fit.ratio(fit.coef(0, j) - fit.coef(1, j), fit.coef(0, j)).to_dict("share_")
        rows.append(row)
    return rows


def family_findings(
    observations: pd.DataFrame, calibrations: Sequence[str] | None = None, measure: str = "sigma"
) -> pd.DataFrame:
    """Per (calibration, n, configuration, family or ``"pooled"``, position p >= 2): the module docstring's numbers.

    ``calibrations``: which to compare with stock (default every calibration of the observations; none: stock
    only, the change and share columns absent).  Columns ``<q>_estimate, <q>_se, <q>_ci_low, <q>_ci_high, <q>_p,
    <q>_G, <q>_clusters`` for q in stock, calibrated, change, share (the share's se: the delta method's; its p: nan),
    ``direction``, and the cluster counts ``sets, topics, components, shared_topics``.  Without families (an audit
    not run by family) only the ``pooled`` rows.
    """
    obs = observations
    if calibrations is None:
        calibrations = [c for c in dict.fromkeys(obs["calibration"]) if c != STOCK_LABEL]
    families = families_of(obs)
    frames = []
    for cal in list(calibrations) or [None]:
        pairs = paired_observations(obs, cal, measure)
        for (n, config), g in pairs.groupby(["n", "config"], sort=False):
            parts = [(f, g[g["family"] == f]) for f in families] + [(POOLED, g)]
            for family, part in parts:
                rows = _fit_rows(part, int(n), cal is not None)
                frames.append(pd.DataFrame(rows).assign(calibration=cal or "", n=int(n), config=config, family=family))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    front = ["calibration", "n", "config", "family", "position", "coef"]
    return out[front + [c for c in out.columns if c not in front]]


def cochran_q(estimates: Sequence[float], ses: Sequence[float]) -> dict[str, float]:
    """Cochran's Q of k estimates with standard errors: ``sum w_i (x_i - x_w)^2``, ``w_i = 1 / se_i^2``, its
    chi2(k - 1) p-value, I² and the inverse-variance weighted mean ``x_w``."""
    x, se = np.asarray(estimates, dtype=float), np.asarray(ses, dtype=float)
    ok = np.isfinite(x) & np.isfinite(se) & (se > 0)
    x, w = x[ok], 1 / se[ok] ** 2
    k = len(x)
    if k < 2:
        return {"k": k, "Q": np.nan, "df": np.nan, "p": np.nan, "I2": np.nan, "weighted_mean": np.nan}
    mean = float(np.sum(w * x) / np.sum(w))
    q = float(np.sum(w * (x - mean) ** 2))
    return {
        "k": k,
        "Q": q,
        "df": k - 1,
        "p": float(stats.chi2.sf(q, k - 1)),
        "I2": max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0,
        "weighted_mean": mean,
    }


QUANTITIES = {"stock": "β stock", "calibrated": "β calibrated", "change": "change", "share": "share removed"}


def heterogeneity(findings: pd.DataFrame) -> pd.DataFrame:
    """Per (calibration, n, configuration, position, quantity): Cochran's Q across the families (:func:`cochran_q`)
    with each family's estimate; empty without two families."""
    f = findings[findings["family"] != POOLED] if len(findings) else findings
    rows = []
    for (cal, n, config, p), g in f.groupby(["calibration", "n", "config", "position"], sort=False):
        if g["family"].nunique() < 2:
            continue
        for q, label in QUANTITIES.items():
            if f"{q}_estimate" not in g or not g[f"{q}_estimate"].notna().any():
                continue
            row = {"calibration": cal, "n": n, "config": config, "position": p, "quantity": label}
            row |= cochran_q(g[f"{q}_estimate"], g[f"{q}_se"])
            row["families"] = "; ".join(f"{r.family}: {getattr(r, f'{q}_estimate'):+.4f}" for r in g.itertuples())
            rows.append(row)
    return pd.DataFrame(rows)


def model_ratio(a: Interval, b: Interval, level: float = 0.95) -> Interval:
    """``a / b`` for estimates of two independent audits (e.g. the same β of two models), Fieller's interval with
    t(min(G_a, G_b) - 1); (nan, nan) when ``b`` is not distinguishable from 0."""
    G = min(a.G, b.G)
    crit = float(stats.t.ppf(0.5 + level / 2, G - 1))
    lo, hi = fieller(a.estimate, b.estimate, a.se**2, b.se**2, 0.0, crit)
    est = a.estimate / b.estimate
    se = float(np.sqrt(a.se**2 / b.estimate**2 + a.estimate**2 * b.se**2 / b.estimate**4))
    return Interval(est, se, lo, hi, G, f"independent audits; t(G-1), G = min({a.G}, {b.G})")


def interval_of(row: pd.Series | dict, q: str) -> Interval:
    """The :class:`Interval` of quantity ``q`` of a :func:`family_findings` row."""
    return Interval(
        float(row[f"{q}_estimate"]),
        float(row[f"{q}_se"]),
        float(row[f"{q}_ci_low"]),
        float(row[f"{q}_ci_high"]),
        int(row[f"{q}_G"]),
        str(row[f"{q}_clusters"]),
        float(row[f"{q}_p"]),
    )
