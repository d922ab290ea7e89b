"""scripts/language_findings.py: its change intervals are the audit's clusters (the more conservative of component
and two-way clustering, checked here against statsmodels), and a sign flip is never "toward 0"."""

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm

from posfair.fairness.ols import position_design

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "language_findings.py"


def _script():
    spec = importlib.util.spec_from_file_location("language_findings", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _observations(seed=0):
    """Stock and calibrated σ of 8 segment sets (n = 3) sharing topics in 5 components (sets 0-1-2, 3-4, 5, 6, 7);
    calibration flips β2 from -0.05 to +0.02 (smaller in size: a naive |calibrated| < |stock| reads "toward 0")."""
    picks = [(0, 1, 2), (2, 3, 4), (4, 5, 6), (7, 8, 9), (9, 10, 11), (12, 13, 14), (15, 16, 17), (18, 19, 20)]
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, 0.08, 21)
    beta = {"stock": (0.0, -0.05, -0.08), "B128-L0.5-a0.5": (0.0, 0.02, -0.04)}
    rows = []
    for s, pick in enumerate(picks):
        u = rng.normal(0, 0.03)
        for j, perm in enumerate(itertools.permutations(range(3))):
            for p, k in enumerate(perm, start=1):
                e = rng.normal(0, 0.02)
                for cal, b in beta.items():
                    rows.append(
                        {"calibration": cal, "setting": "main", "n": 3, "config": "en", "family": "",
                         "doc_id": f"s{s}-p{j}", "set_id": f"s{s}", "topic": f"t{pick[k]:02d}", "position": p,
                         "sigma": 0.6 + b[p - 1] + effect[pick[k]] + u + e + rng.normal(0, 0.005)}
                    )  # fmt: skip
    return pd.DataFrame(rows)


def test_change_interval_is_the_audits_clusters_and_a_flip_is_not_toward_zero(tmp_path):
    obs = _observations()
    folder = tmp_path / "pos"
    folder.mkdir()
    obs.to_parquet(folder / "observations.parquet")
    table = _script().position_table([("m", folder)])
    row = next(line for line in table.splitlines() if "| β2 |" in line)
    # independent: statsmodels on the paired difference, clustered by the components drawn by hand and two-way
    wide = obs.pivot_table(index=["doc_id", "position", "set_id", "topic"], columns="calibration", values="sigma")
    wide = wide.reset_index()
    diff = (wide["B128-L0.5-a0.5"] - wide["stock"]).to_numpy()
    X = position_design(wide["position"].to_numpy(), 3)
    comp = wide["set_id"].map({"s0": 0, "s1": 0, "s2": 0, "s3": 1, "s4": 1, "s5": 2, "s6": 3, "s7": 4}).to_numpy()
    two = np.column_stack([pd.factorize(wide["set_id"])[0], pd.factorize(wide["topic"])[0]])
    cis = [
        sm.OLS(diff, X).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True).conf_int()[1] for g in (comp, two)
    ]
    lo, hi = max(cis, key=lambda c: c[1] - c[0])
    assert lo > 0  # the change is clearly up ...
    assert f"[{lo:+.3f}, {hi:+.3f}] past 0 (sign flipped)" in row  # ... but past 0, not toward it
    assert "toward 0" not in row
