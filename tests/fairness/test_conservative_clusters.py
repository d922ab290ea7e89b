"""The audit's default clustering, 'conservative': per coefficient the wider interval of two-way (set+topic) and
connected-component clustering, each at t(G-1) with its own G, and the output naming the clustering every interval
used.  Checked against statsmodels fits of both clusterings computed here, the components drawn by hand."""

import warnings

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from posfair.fairness.analysis import fit_all
from posfair.fairness.audit_result import AuditResult
from posfair.fairness.audit_tables import coefficient_detail_table, coefficient_table
from posfair.stats.inference import FewClustersWarning, Inference
from posfair.stats.position_ols import fit_position_ols, position_design
from shared_topics import shared_topic_table as _table


def _quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)
        return fit_position_ols(*args, **kwargs)


def _expected(d: pd.DataFrame, col: str):
    """Per coefficient (se, p, ci, G, kind) of the wider 95 % interval of statsmodels' two-way fit (two group columns)
    and its one-way fit on the components drawn by hand (:func:`_table`)."""
    X = position_design(d["position"].to_numpy(), 3)
    y = d[col].to_numpy()
    two_codes = np.column_stack([pd.factorize(d["set"])[0], pd.factorize(d["topic"])[0]])
    fits = {
        "two-way": (sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": two_codes}, use_t=True), 8),
        "components": (sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": d["component"]}, use_t=True), 5),
    }
    out = []
    for j in range(3):
        width = {k: stats.t.ppf(0.975, G - 1) * f.bse[j] for k, (f, G) in fits.items()}
        kind = "components" if width["components"] >= width["two-way"] else "two-way"
        f, G = fits[kind]
        out.append((f.bse[j], f.pvalues[j], np.asarray(f.conf_int())[j], G, kind))
    return out


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_conservative_default_is_the_wider_of_two_way_and_components_per_coefficient(seed):
    d = _table(seed)
    kinds = set()
    for col in ("stock", "cal"):
        fit = _quiet(d[col], d["position"], d["set"], n=3, topics=d["topic"])  # the default
        assert fit.inference == "CR1 conservative t(G-1)"
        frame = fit.to_frame()
        for j, (se, p, ci, G, kind) in enumerate(_expected(d, col)):
            kinds.add(kind)
            row = frame.iloc[j]
            assert row["se"] == pytest.approx(se, rel=1e-8) and row["p"] == pytest.approx(p, rel=1e-6)
            np.testing.assert_allclose([row["ci_low"], row["ci_high"]], ci, rtol=1e-8)
            assert row["clusters"] == G
            if kind == "components":
                assert row["cluster_by"] == "components (5 of 8 sets sharing topics; wider than two-way)"
            else:
                assert row["cluster_by"] == "set+topic (8 sets, 21 topics; wider than the 5 components)"
        np.testing.assert_array_equal(fit.conf_int(), frame[["ci_low", "ci_high"]].to_numpy())
        # the summary is one clustering's fit; a coefficient whose interval used the other is named under it
        notes = fit.summary().as_text()
        for name, used in zip(fit.names, fit.fit.used, strict=True):
            assert (f"{name}: G = " in notes) == (used != fit.fit.main)
    assert kinds == {"components", "two-way"}  # these data make the two clusterings each the wider somewhere


def test_conservative_without_shared_topics_is_the_set_clustering_and_says_so():
    d = _table(2)
    d["topic"] = d["set"] + "/" + d["topic"]  # every set its own topics: no topic in two sets
    fit = _quiet(d["stock"], d["position"], d["set"], n=3, topics=d["topic"])
    X = position_design(d["position"].to_numpy(), 3)
    ref = sm.OLS(d["stock"].to_numpy(), X).fit(cov_type="cluster", cov_kwds={"groups": d["set"]}, use_t=True)
    np.testing.assert_allclose(fit.bse, ref.bse, rtol=1e-9)
    np.testing.assert_allclose(fit.pvalues, ref.pvalues, rtol=1e-7)
    np.testing.assert_allclose(fit.conf_int(), ref.conf_int(), rtol=1e-9)
    assert fit.n_clusters == 8 and list(fit.G) == [8, 8, 8]
    assert fit.cluster_by == "sets (8 sets, no topic in two sets: two-way = components = sets)"


def _observations(d: pd.DataFrame) -> pd.DataFrame:
    """The table as an audit's observations: one instance, stock and calibrated."""
    base = d.rename(columns={"set": "set_id"}).assign(setting="main", n=3, config="en", config_key="en")
    return pd.concat(
        [base.assign(calibration=c, sigma=base[col]) for c, col in (("stock", "stock"), ("cal", "cal"))],
        ignore_index=True,
    )


def test_the_audits_tables_and_inference_text_name_each_intervals_clustering():
    d = _table(0)
    obs = _observations(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewClustersWarning)
        coefs = fit_all(obs, ["sigma"])  # the default
        two = fit_all(obs, ["sigma"], Inference(clusters="set+topic"))
    stock = coefs[coefs["calibration"] == "stock"].sort_values("position")
    expected = _expected(d, "stock")
    assert stock["clusters"].tolist() == [e[3] for e in expected]
    assert set(two["clusters"]) == {8}  # set+topic, asked for: one G = min(sets, topics) for every coefficient
    # the paper layout's G row: each coefficient's G where they differ; the caption: which clustering each used
    kw = dict(model="m", measure="sigma", calibration="stock", setting="main", configs=["en"])
    t = coefficient_table(coefs, **kw)
    assert t.frame.loc[(3, "G (clusters)"), "en"] == "/".join(str(e[3]) for e in expected)
    assert "β2 G=" in t.caption and "components (5 of 8 sets sharing topics; wider than two-way)" in t.caption
    detail = coefficient_detail_table(coefs, **kw)
    assert detail.frame["clusters"].tolist() == [e[4] for e in expected]
    # the inference text counts the intervals per clustering; the headline's G says what a cluster is
    result = AuditResult(model={"name": "m"}, corpus={"name": "c"}, settings={"clusters": "conservative"},
                         calibrations=[], observations=obs, coefficients=coefs, sampling=[])  # fmt: skip
    text = result.inference_text()
    slopes = coefs[coefs["position"] > 1]
    n_comp = int((slopes["clusters"] == 5).sum())
    assert f"{n_comp} clustered by component (G = 5)" in text  # intervals counted, never called "sets"
    assert f"{len(slopes) - n_comp} two-way by set and topic (G = 8)" in text and f"{len(slopes)} in all" in text
    assert "wider interval of two-way clustering" in text
    hf = result.headline_frame()
    row = coefs[(coefs["position"] == 2)].set_index("calibration")
    cells = {c: f"{int(row.loc[c, 'clusters'])} {'components' if row.loc[c, 'clusters'] == 5 else 'two-way'}"
             for c in ("cal", "stock")}  # fmt: skip
    want = cells["stock"] if len(set(cells.values())) == 1 else f"stock: {cells['stock']}; cal: {cells['cal']}"
    assert hf.loc[(3, "en", "beta_2"), "G"] in (want, f"cal: {cells['cal']}; stock: {cells['stock']}")
