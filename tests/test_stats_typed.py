"""posfair.stats carries what a fit used as typed values, not as strings read back: the inference of a fit
(:class:`InferenceLabel`, whose parse of a saved label round-trips), the eigenvalue fix of a two-way covariance
(numbers built from the fixed covariance while statsmodels' results object stays statsmodels' own)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats
from statsmodels.regression.linear_model import OLS

from posfair.stats.clusters import CLUSTERINGS, cluster_structure, fit_clustered, psd_fixed
from posfair.stats.inference import Inference, InferenceLabel, describe_inference
from posfair.stats.position_ols import position_design


@pytest.mark.parametrize(
    ("method", "weights", "clusters", "G"),
    list(itertools.product(("cluster", "wild"), ("webb", "rademacher"), CLUSTERINGS, (None, 3, 20))),
)
def test_a_label_reads_back_as_the_inference_that_wrote_it(method, weights, clusters, G):
    spec = Inference(method=method, weights=weights, clusters=clusters, draws=999, seed=7)
    label = spec.label(G)
    used = InferenceLabel.parse(label)
    assert used == spec.used(G) and used.text() == label
    enumerated = method == "wild" and weights == "rademacher" and G == 3  # 2^3 < 999 draws
    assert (used.enumerated == 3) == enumerated
    assert ("all 2^3" in label) == enumerated and ("B=999 seed=7" in label) == (method == "wild" and not enumerated)
    assert describe_inference([label, label]) == used.sentence()
    if G is None:
        assert spec.describe() == describe_inference([label])


def test_labels_of_older_runs_and_unknown_text():
    assert InferenceLabel.parse("CR1 t(G-1)") == InferenceLabel("cluster", "set")
    assert InferenceLabel.parse("wild WCR11 webb B=9999 seed=0") == InferenceLabel("wild", "set", "webb", 9999, 0)
    assert InferenceLabel.parse("CR1 by hand") is None
    assert describe_inference(["CR1 by hand"]) == "CR1 by hand"


def _two_way_data():
    """60 observations in 6 sets and 5 topics whose two-way CR1 covariance has a negative eigenvalue."""
    rng = np.random.default_rng(2)
    sets, topics = rng.integers(0, 6, 60), rng.integers(0, 5, 60)
    X = position_design(np.tile([1, 2, 3], 20), 3)
    y = rng.normal(size=60) + 0.3 * sets
    return y, X, sets.astype(str), topics.astype(str)


@pytest.mark.parametrize("by", ["set+topic", "conservative"])
def test_the_eigenvalue_fix_leaves_statsmodels_results_alone(by):
    y, X, sets, topics = _two_way_data()
    st = cluster_structure(sets, topics, "set+topic")
    fresh = OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": st.codes}, use_t=True)
    fixed = psd_fixed(np.asarray(fresh.cov_params()))
    assert fixed is not None  # the data do need the fix
    fit = fit_clustered(y, X, sets, topics, by)
    assert "set+topic" in fit.fixed
    # statsmodels' object is statsmodels' own fit, not given another covariance
    np.testing.assert_array_equal(np.asarray(fit.results["set+topic"].cov_params()), np.asarray(fresh.cov_params()))
    np.testing.assert_array_equal(fit.results["set+topic"].bse, fresh.bse)
    # the fit's numbers are those of the fixed covariance, at t(G-1), by hand
    se = np.sqrt(np.diag(fixed))
    two = [j for j, u in enumerate(fit.used) if u == "set+topic"]
    assert two, "some coefficient uses the two-way clustering"
    np.testing.assert_allclose(fit.bse[two], se[two], rtol=1e-12)
    p = 2 * stats.t.sf(np.abs(fresh.params / se), st.G - 1)
    np.testing.assert_allclose(fit.pvalues[two], p[two], rtol=1e-9)
    half = stats.t.ppf(0.975, st.G - 1) * se
    np.testing.assert_allclose(
        fit.ci[two], np.column_stack([fresh.params - half, fresh.params + half])[two], rtol=1e-12
    )
    assert all(fit.psd_fixed[j] for j in two) and all("positive semi-definite" in fit.clusters[j] for j in two)
