"""scripts/language_findings.py: its change intervals are the audit's clusters (the more conservative of component
and two-way clustering, checked here against statsmodels), and a sign flip is never "toward 0"."""

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from posfair.stats.position_ols import position_design

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


def _grid_observations(seed=0):
    """A by-family language grid (en, de, fr; n = 3): per family 4 sets of 3 of its 6 topics per instance (so the
    instances' sets share topics within a family, never across), stock and calibrated σ and the margin."""
    rng = np.random.default_rng(seed)
    lang_effect = {"en": 0.0, "de": 0.03, "fr": -0.02}
    rows = []
    for family in ("faq", "guide"):
        topic_effect = rng.normal(0, 0.05, 6)
        for lead, later in itertools.product(lang_effect, repeat=2):
            for s in range(4):
                pick = rng.choice(6, 3, replace=False)
                set_id = f"{family}-{lead}-{later}-s{s}"
                for j, perm in enumerate(itertools.permutations(range(3))):
                    for p, k in enumerate(perm, start=1):
                        lang = lead if p == 1 else later
                        base = 0.6 - 0.02 * (p - 1) + lang_effect[lang] + topic_effect[pick[k]] + rng.normal(0, 0.02)
                        for cal, shift in (("stock", 0.0), ("B128-L0.5-a0.5", 0.01 * (p - 1))):
                            sigma = base + shift + rng.normal(0, 0.005)
                            rows.append(
                                {"calibration": cal, "setting": "main", "n": 3, "family": family,
                                 "config": f"[{lead}, {later}, ..., {later}]" if lead != later else lead,
                                 "config_key": f"{lead}-{later}" if lead != later else lead,
                                 "doc_id": f"{set_id}-p{j}", "set_id": set_id, "topic": f"{family}-t{pick[k]}",
                                 "position": p, "lang": lang, "lead_lang": lead, "later_lang": later,
                                 "seg_tokens": 50 + 5 * (lang == "de") + rng.integers(0, 5), "sigma": sigma,
                                 "margin": sigma - 0.3}
                            )  # fmt: skip
    return pd.DataFrame(rows)


def test_language_change_per_family_is_the_wider_of_components_and_two_way():
    obs = _grid_observations()
    eff = _script().language_effects_by_family(obs)
    assert set(eff["family"]) == {"faq", "guide", "pooled"} and set(eff["language"]) == {"de", "fr"}
    import statsmodels.formula.api as smf
    from scipy import stats

    for family in ("faq", "pooled"):
        o = obs if family == "pooled" else obs[obs["family"] == family]
        later = o[o["position"] >= 2]
        wide = later.pivot_table(
            index=["doc_id", "position", "set_id", "topic", "lang", "lead_lang"], columns="calibration", values="sigma"
        ).reset_index()
        wide["diff"] = wide["B128-L0.5-a0.5"] - wide["stock"]
        model = smf.ols("diff ~ C(lang, Treatment('en')) + C(position) + C(lead_lang, Treatment('en'))", data=wide)
        comp = wide["set_id"].str.split("-").str[0].map({"faq": 0, "guide": 1})  # by hand: one component per family
        two = np.column_stack([pd.factorize(wide["set_id"])[0], pd.factorize(wide["topic"])[0]])
        fits = {}
        if family == "pooled":
            fits["components"] = (model.fit(cov_type="cluster", cov_kwds={"groups": comp}, use_t=True), 2)
        fits["two-way"] = (
            model.fit(cov_type="cluster", cov_kwds={"groups": two}, use_t=True),
            min(wide["set_id"].nunique(), wide["topic"].nunique()),
        )
        row = eff[(eff["family"] == family) & (eff["language"] == "de")].iloc[0]["change"]
        term = "C(lang, Treatment('en'))[T.de]"
        widths = {k: stats.t.ppf(0.975, G - 1) * f.bse[term] for k, (f, G) in fits.items()}
        use = max(widths, key=widths.get)
        f, G = fits[use]
        assert row["estimate"] == pytest.approx(f.params[term], abs=1e-10)
        assert row["G"] == G
        if "positive semi-definite" in row["clusters"]:  # the joint two-way covariance needed the eigenvalue fix
            assert use == "two-way" and row["se"] != pytest.approx(f.bse[term], rel=1e-6)
        else:
            assert row["se"] == pytest.approx(f.bse[term], rel=1e-6)
        # one family's sets are one connected component: two-way, said so; pooled: the wider, named
        assert row["clusters"].startswith("components (2 of" if use == "components" else "set+topic (")
