"""Calibration settings as one value: the command-line form reads back to the setting, the pooling's choices are
named, and the basket functions take one BasketSettings (the keyword form is the same value)."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
import torch

from posfair import Calibration
from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.params import POOLING_DECIDES, BasketSettings
from posfair.calibration.rule import row_changes
from reference import reference_calibrate_row, reference_layer_strength

PRIOR = {"values": [[2.0, 1.0, 0.5]]}


# -- spec(): the one form that parses, and it reads back to the setting ------------------------------------------


def settings_grid():
    """Settings the command line could not write before: the rows, the isolated keys one by one, their weights,
    one explicit layer, a strength %g rounds; with the variants beside them."""
    for layers, strength, bos, eos, bw, ew, queries, extra in itertools.product(
        (0.5, 3, (4,), (1, 5)),
        (1.0, 0.123456789),
        (None, True, False),
        (None, True),
        ("original", "equal", 0.1),
        ("equal", 0.2),
        (None, "pool", "all"),
        ({}, dict(self_share=0.3, trailing="merge"), dict(prior=PRIOR, schedule="falling")),
    ):
        yield Calibration(16, layers, strength, bos, eos, bw, ew, queries, **extra)


def test_spec_reads_back_to_every_setting(tmp_path):
    prior_file = tmp_path / "prior.json"
    prior_file.write_text(json.dumps({"prior": PRIOR}))
    n = 0
    for cal in settings_grid():
        spec = cal.spec(str(prior_file))
        assert Calibration.parse(spec) == cal, spec
        n += 1
    assert n == 4 * 2 * 3 * 2 * 3 * 2 * 3 * 3


def test_spec_spells_the_settings_it_adds():
    cal = Calibration(64, (4,), 1.0, isolate_bos=True, isolate_eos=False, bos_weight=0.1, queries="all")
    assert cal.spec() == "64,4+,1,isolate_bos=true,isolate_eos=false,bos_weight=0.1,queries=all"
    assert Calibration.parse("64,4+,1").layers == (4,) and Calibration.parse("64,4,1").layers == 4
    both = Calibration(16, 1, 1.0, isolate_bos=True, isolate_eos=True, bos_weight=0.1, eos_weight=0.1)
    assert both.spec() == "16,1,1,special=0.1"  # special= when it says all four
    with pytest.raises(ValueError, match="gives special= and bos_weight=: special= sets isolate_bos"):
        Calibration.parse("16,1,1,special=0.1,bos_weight=0.2")
    for spec, match in [
        ("16,1,1,queries=some", "queries= in calibration spec '16,1,1,queries=some' must be pool or all"),
        ("16,1,1,isolate_bos=yes", "isolate_bos= in calibration spec .* must be true or false"),
        ("16,1,1,eos_weight=big", "eos_weight= in calibration spec .* must be 'original', 'equal' or a float"),
    ]:
        with pytest.raises(ValueError, match=match):
            Calibration.parse(spec)


# -- POOLING_DECIDES: None means "off" only ---------------------------------------------------------------------


def test_the_pooling_decides_is_a_named_value_and_none_is_taken_for_it():
    cal = Calibration()
    assert cal.isolate_bos is cal.isolate_eos is cal.queries is POOLING_DECIDES
    assert cal.prior is None and cal.self_share is None  # None: off
    assert Calibration(isolate_bos=None, isolate_eos=None, queries=None) == cal
    with pytest.raises(TypeError, match="POOLING_DECIDES"):
        bool(cal.isolate_bos)
    # written as null, so the key of a setting is the digest of the JSON it always had
    d = cal.to_dict()
    assert d["isolate_bos"] is None and d["queries"] is None and Calibration.from_dict(d) == cal
    assert cal.key() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    for pooling, bos, eos, rows in [("cls", True, False, "pool"), ("lasttoken", True, True, "pool"),
                                    ("mean", False, False, "all")]:  # fmt: skip
        concrete = cal.pooled(pooling)
        assert (concrete.isolate_bos, concrete.isolate_eos, concrete.queries) == (bos, eos, rows)
        given = Calibration(isolate_bos=False, queries="all").pooled(pooling)
        assert (given.isolate_bos, given.queries) == (False, "all")  # what is given stays


def test_the_rule_refuses_a_setting_the_pooling_has_yet_to_decide():
    C = np.array([127, 128, 129, 300])
    with pytest.raises(TypeError, match="resolve the calibration for the model's pooling"):
        row_changes(C, Calibration(basket_size=128))
    mean = Calibration(basket_size=128, strength=1.0)
    want = [False, False, True, True]  # one basket of 128 with nothing isolated is left as it is
    assert row_changes(C, mean.pooled("mean")).tolist() == want
    assert row_changes(C, mean.resolve("mean", 4)).tolist() == want
    assert row_changes(C, mean.resolve("mean", 4).baskets(3)).tolist() == want


# -- BasketSettings: the one value the basket functions take ---------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "mean", "lasttoken"])
def test_the_basket_functions_take_one_value_built_per_layer(pooling):
    prior = {"values": [[1.0, 3.0], [2.0, 1.0]], "layers": [2, 3]}
    cal = Calibration(basket_size=3, layers=2, strength=0.8, self_share=0.5, schedule="rising", trailing="weighted",
                      prior=prior, eos_weight=0.1)  # fmt: skip
    r = cal.resolve(pooling, 4)
    rng = np.random.default_rng(0)
    K, s, e = 14, 1, 12
    rows = np.zeros((e - s + 1, K))
    rows[:, s : e + 1] = rng.dirichlet(np.ones(e - s + 1), size=e - s + 1)
    a = torch.tensor(rows)
    own = torch.arange(s, e + 1)
    for layer in (2, 3):
        settings = r.baskets(layer)
        assert settings.strength == pytest.approx(reference_layer_strength(r, layer))
        assert settings.prior == r.prior.density(layer)
        got = calibrate_rows(a, s, e, settings, self_key=own)
        assert torch.equal(got, calibrate_rows(a, s, e, self_key=own, **r.basket_kwargs(layer)))
        assert torch.equal(calibrate_span_(a.clone(), s, e, settings, row_offset=s), got)
        for i, q in enumerate(own.tolist()):
            want = reference_calibrate_row(rows[i], s, e, 3, settings.strength, r.isolate_bos, r.isolate_eos,
                                           r.bos_weight, r.eos_weight, prior=settings.prior, self_share=0.5,
                                           self_key=q, trailing="weighted")  # fmt: skip
            np.testing.assert_allclose(got[i].numpy(), want, atol=1e-12)
    with pytest.raises(TypeError, match="not both"):
        calibrate_rows(a, s, e, r.baskets(2), strength=1.0)
    assert BasketSettings(basket_size=3).kwargs() == dict(basket_size=3, strength=1.0, isolate_bos=False,
                                                          isolate_eos=False, bos_weight="original", eos_weight="equal")  # fmt: skip
