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


def test_inference_values_are_typed_and_checked_when_made():
    """The method, clustering and weights of an inference are values of their Literal types (the tuples listing them
    are those types' arguments), and an InferenceLabel outside them is refused when made, not written as a label
    no reader knows."""
    from typing import get_args

    from posfair.stats.clusters import STRUCTURES, Clustering, Structure
    from posfair.stats.inference import BOOTSTRAP_WEIGHTS, INFERENCE_METHODS, BootstrapWeights, InferenceMethod

    assert get_args(InferenceMethod) == INFERENCE_METHODS == ("cluster", "wild")
    assert get_args(BootstrapWeights) == BOOTSTRAP_WEIGHTS and get_args(Clustering) == CLUSTERINGS
    assert get_args(Structure) == STRUCTURES and set(CLUSTERINGS) == {"conservative", *STRUCTURES}
    for bad in (("clustered", "set"), ("cluster", "sets"), ("cluster", "set", "webb"), ("wild", "set"),
                ("wild", "set", "gauss", 999, 0)):  # fmt: skip
        with pytest.raises(ValueError):
            InferenceLabel(*bad)
    assert InferenceLabel("wild", "component", "webb", 999, 0).text() == "wild WCR11 component webb B=999 seed=0"


def test_the_conservative_choice_is_a_typed_value():
    """conservative_choice says which structure an interval uses, what a cluster then is in one word, and why, as
    fields (a ClusterChoice), not a pair of strings whose first word is read back."""
    from posfair.stats.clusters import ClusterChoice, conservative_choice

    sets = ["a", "a", "b", "b", "c", "c", "d", "d"]
    shared = cluster_structure(sets, ["x", "y", "y", "z", "u", "v", "v", "w"], "set+topic")
    comp = cluster_structure(sets, ["x", "y", "y", "z", "u", "v", "v", "w"], "component")
    wide_two = conservative_choice(shared, comp, {"set+topic": 2.0, "component": 1.0})
    assert isinstance(wide_two, ClusterChoice) and (wide_two.by, wide_two.kind) == ("set+topic", "two-way")
    wide_comp = conservative_choice(shared, comp, {"set+topic": 1.0, "component": 2.0})
    assert (wide_comp.by, wide_comp.kind) == ("component", "components") and wide_comp.why.startswith("components (2")
    disjoint = cluster_structure(sets, ["x", "y", "z", "t", "u", "v", "w", "q"], "set+topic")
    alone = conservative_choice(disjoint, cluster_structure(sets, ["x", "y", "z", "t", "u", "v", "w", "q"],
                                                            "component"), {"set+topic": 1.0, "component": 1.0})  # fmt: skip
    assert (alone.by, alone.kind) == ("component", "sets")


def test_the_coefficients_carry_the_kind_of_cluster_typed():
    """Every coefficient row holds what a cluster is in one word (cluster_kind, the fit's own kinds); the captions
    read that column and parse the cluster_by label only for a coefficients.csv saved before the column existed."""
    from posfair.fairness.analysis import clusters_used_text, headline_clusters
    from posfair.stats.position_ols import fit_position_ols

    rng = np.random.default_rng(3)
    sets = np.repeat([f"s{i}" for i in range(8)], 6)
    topics = np.array([f"t{(i // 6 + k % 2) % 5}" for i, k in enumerate(range(48))])  # neighbouring sets share
    positions = np.tile([1, 2, 3], 16)
    fit = fit_position_ols(rng.normal(size=48), positions, sets, topics=topics, n=3, warn=False)
    frame = fit.to_frame().assign(measure="sigma", calibration="stock")
    assert frame["cluster_kind"].tolist() == list(fit.fit.kinds) and set(fit.fit.kinds) <= {"components", "two-way"}
    text = clusters_used_text(frame)
    relabelled = frame.assign(cluster_by="what a cluster is, in other words")  # the label's wording is free
    assert clusters_used_text(relabelled) == text and headline_clusters(relabelled) == headline_clusters(frame)
    old = frame.drop(columns="cluster_kind")  # a run saved before the column: its labels are read
    assert clusters_used_text(old) == text
