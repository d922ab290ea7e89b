"""Calibration settings as one value: the command-line form reads back to the setting, the pooling's choices are
named, and the basket functions take one BasketSettings, built once per calibrated layer in a forward pass (no
keyword form), which is also the one value the rule reads."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest
import torch

from posfair import Calibration
from posfair.calibration import fused, kernels
from posfair.calibration.baskets import basket_weights, calibrate_rows, calibrate_span_
from posfair.calibration.coverage import text_settings
from posfair.calibration.params import POOLING_DECIDES, BasketSettings, ResolvedCalibration
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
        row_changes(C, BasketSettings(basket_size=128, isolate_bos=POOLING_DECIDES))
    with pytest.raises(ValueError, match="needs the model's pooling"):
        text_settings(Calibration(basket_size=128))
    mean = Calibration(basket_size=128, strength=1.0)
    want = [False, False, True, True]  # one basket of 128 with nothing isolated is left as it is
    assert row_changes(C, text_settings(mean, "mean")).tolist() == want
    assert row_changes(C, text_settings(mean.resolve("mean", 4))).tolist() == want
    assert row_changes(C, mean.resolve("mean", 4).baskets(3)).tolist() == want
    cls = [False, True, True, True]  # CLS pooling isolates BOS: 127 content keys of 128 tokens are too few
    assert row_changes(C + 1, text_settings(mean, "cls")).tolist() == cls


def test_the_rule_takes_one_type():
    """row_changes and the predicates beside it read a BasketSettings only (they took three types before)."""
    C = np.array([127, 128, 129, 300])
    mean = Calibration(basket_size=128, strength=1.0)
    for other in (mean.pooled("mean"), mean.resolve("mean", 4), {"basket_size": 128}):
        with pytest.raises(TypeError, match="takes a BasketSettings"):
            row_changes(C, other)


def test_text_settings_is_zero_only_when_every_layer_is():
    """The whole calibration's setting for the rule: strength 0 only when every layer's and head's is."""
    C = np.array([4, 9, 40])
    pooled = dict(isolate_bos=False, isolate_eos=False)
    assert not row_changes(C, text_settings(Calibration(8, (2, 3), 0.0, **pooled), "mean")).any()
    heads = Calibration(8, (2, 3), 0.0, head_strengths={3: (0, 0.5)}, **pooled)
    assert row_changes(C, text_settings(heads, "mean")).tolist() == [False, True, True]
    rising = Calibration(8, (2, 3), 0.4, schedule="rising", **pooled)
    assert row_changes(C, text_settings(rising.resolve("mean", 4))).tolist() == [False, True, True]


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
        assert torch.equal(calibrate_span_(a.clone(), s, e, settings, row_offset=s), got)
        for i, q in enumerate(own.tolist()):
            want = reference_calibrate_row(rows[i], s, e, 3, settings.strength, r.isolate_bos, r.isolate_eos,
                                           r.bos_weight, r.eos_weight, prior=settings.prior, self_share=0.5,
                                           self_key=q, trailing="weighted")  # fmt: skip
            np.testing.assert_allclose(got[i].numpy(), want, atol=1e-12)


def test_loose_keyword_fields_are_a_type_error():
    """One calling convention: a BasketSettings, never its fields as keywords (the old second form), nor both."""
    rows = torch.softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    settings = BasketSettings(basket_size=3, strength=0.5)
    want = calibrate_rows(rows, 0, 11, settings)
    assert not torch.allclose(want, rows)  # the value form calibrates
    with pytest.raises(TypeError):
        calibrate_rows(rows, 0, 11, basket_size=3, strength=0.5)
    with pytest.raises(TypeError):
        calibrate_rows(rows, 0, 11, settings, strength=1.0)
    with pytest.raises(TypeError):
        calibrate_span_(rows.clone(), 0, 11, basket_size=3)
    with pytest.raises(TypeError):
        basket_weights(rows[:, :4], 4, None, None, strength=0.5)  # no basket_size=1 stand-in any more
    with pytest.raises(TypeError, match="take a BasketSettings"):
        calibrate_rows(rows, 0, 11, {"basket_size": 3})
    assert torch.equal(calibrate_span_(rows.clone(), 0, 11, settings), want)
    for gone in ("given", "kwargs"):
        assert not hasattr(BasketSettings, gone)
    assert not hasattr(ResolvedCalibration, "basket_kwargs")


@pytest.mark.parametrize("path", ["fused", "tiled", "tiled-heads"])
def test_the_setting_is_built_once_per_layer_per_forward(tiny_model, monkeypatch, path):
    """A forward builds each calibrated layer's BasketSettings once, whatever the number of tiles (it was built for
    every tile, and twice or three times per layer on the fused path)."""
    model = tiny_model("bert-mean")
    n_layers = model.transformer_module.num_layers
    heads = {n_layers - 1: (0.2, 0.4, 0.6, 0.8)} if path == "tiled-heads" else None
    cal = Calibration(basket_size=4, layers=0.5, strength=0.7, head_strengths=heads)
    features = model.tokenize(["alpha beta gamma delta " * 15])
    L = features["input_ids"].shape[1]
    tiles = []
    if path != "fused":
        monkeypatch.setattr(fused, "ENABLED", False)
        monkeypatch.setattr(kernels, "TILE_BYTES", 4 * 4 * L * 8)  # 8 query rows per tile: 1 text, 4 heads, L keys
        inner_tile = kernels._calibrate_tile
        monkeypatch.setattr(kernels, "_calibrate_tile", lambda *a, **kw: tiles.append(1) or inner_tile(*a, **kw))
    built = []
    inner_init = BasketSettings.__post_init__
    monkeypatch.setattr(BasketSettings, "__post_init__", lambda self: built.append(self) or inner_init(self))
    with torch.no_grad(), model.using(cal):
        built.clear()
        model(dict(features))
    calibrated = n_layers // 2
    if path != "fused":
        assert len(tiles) == calibrated * -(-L // 8) > 2 * calibrated  # 8 rows per tile
    # one per calibrated layer; with per-head strengths the layer's setting laid out as its heads once more
    assert len(built) == calibrated + (path == "tiled-heads")
    assert [b.head_strength for b in built if b.head_strength is not None] == ([(0.2, 0.4, 0.6, 0.8)] if heads else [])
