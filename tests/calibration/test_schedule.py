"""Per-layer strength schedules (``Calibration.schedule``, issue 27 item 6): how the strength is spread over
the K calibrated layers.  ``"flat"`` (the papers', default): alpha in each; ``"rising"``: the k-th layer
(1-based, from the first) gets alpha k / K; ``"falling"``: alpha (K - k + 1) / K.

The per-layer strengths by hand, every backend (registry fast and eager paths, the intercepted SDPA
fallback, remote-code models) against the independent float64 reference (``tests/reference.py``, which
computes each layer's strength from the definition), combined with the variants, persistence, the
command line and the tuner's grid.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

import posfair
import posfair.calibration.fused as fused
from posfair import Calibration
from posfair.calibration.params import SCHEDULES, PositionalPrior
from posfair.tuning import SearchSpace
from reference import fast_and_reference
from tiny_models import eager_attention

TEXTS = [" ".join(["word"] * 25), " ".join(["alpha", "beta"] * 10), "gamma delta " * 6]


def _fast_and_reference(model, cal, texts=TEXTS):
    return fast_and_reference(model, texts, cal)


def test_each_layers_strength_by_hand():
    cal = Calibration(basket_size=8, layers=0.5, strength=0.9)
    r = {s: Calibration(basket_size=8, layers=0.5, strength=0.9, schedule=s).resolve("mean", 6) for s in SCHEDULES}
    assert r["flat"].layers == (3, 4, 5)
    assert [r["flat"].baskets(i).strength for i in (3, 4, 5)] == [0.9, 0.9, 0.9]
    assert [r["rising"].baskets(i).strength for i in (3, 4, 5)] == pytest.approx([0.3, 0.6, 0.9])
    assert [r["falling"].baskets(i).strength for i in (3, 4, 5)] == pytest.approx([0.9, 0.6, 0.3])
    # explicit layers in any order: ranked from the first calibrated layer
    explicit = Calibration(basket_size=8, layers=(5, 1), strength=1.0, schedule="rising").resolve("cls", 6)
    assert (explicit.baskets(1).strength, explicit.baskets(5).strength) == (0.5, 1.0)
    # one calibrated layer: every schedule is flat
    one = [Calibration(basket_size=8, layers=1, strength=0.7, schedule=s).resolve("cls", 6) for s in SCHEDULES]
    assert {c.baskets(5).strength for c in one} == {0.7}
    with pytest.raises(ValueError, match="needs one of the calibrated layers"):
        r["rising"].baskets(2)
    assert cal.key() == Calibration(basket_size=8, layers=0.5, strength=0.9, schedule="flat").key()


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3", "modernbert"])
def test_every_architecture_matches_the_reference_and_the_schedules_differ(tiny_model, arch):
    model = tiny_model(arch)
    got = {}
    for schedule in SCHEDULES:
        cal = Calibration(basket_size=8, layers=1.0, strength=0.9, schedule=schedule)
        fast, ref = _fast_and_reference(model, cal)
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
        got[schedule] = fast
    for a, b in (("flat", "rising"), ("flat", "falling"), ("rising", "falling")):
        assert float((got[a] - got[b]).abs().max()) > 1e-4, (a, b)


def test_tiled_and_eager_paths_and_the_variants_match_the_reference(tiny_model, monkeypatch):
    model = tiny_model("bert-mean")
    layers = model.transformer_module.resolve(Calibration(layers=1.0)).layers
    prior = PositionalPrior(values=tuple((3.0, 1.5, 1.0, 0.5, 1.0 + i) for i in range(len(layers))), layers=layers)
    cals = [
        Calibration(basket_size=8, layers=1.0, strength=1.0, schedule="rising", prior=prior).with_special("original"),
        Calibration(basket_size=8, layers=1.0, strength=0.8, schedule="falling", self_share=1.0, trailing="weighted"),
    ]
    for cal in cals:
        fast, ref = _fast_and_reference(model, cal)
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
    monkeypatch.setattr(fused, "ENABLED", False)
    tiled, ref = _fast_and_reference(model, Calibration(basket_size=8, layers=1.0, strength=1.0, schedule="rising"))
    torch.testing.assert_close(tiled, ref, atol=1e-5, rtol=0)
    if model.mechanism == "registry":  # transformers 5.x: the registry's eager explicit path
        with eager_attention(model):
            eager, _ = _fast_and_reference(model, cals[0])
        torch.testing.assert_close(eager, _fast_and_reference(model, cals[0])[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_remote_code_models_match_the_reference(remote_model, pooling):
    """The fallback (softmax and SDPA intercepted) on remote-code models == their float64 reference."""
    from remote_code_models import assert_every_kind_matches_the_reference

    texts = [" ".join(["word"] * 13), "alpha beta " * 5]
    for schedule in ("rising", "falling"):
        cal = Calibration(basket_size=4, layers=1.0, strength=1.0, schedule=schedule)
        assert_every_kind_matches_the_reference(remote_model, pooling, texts, cal)


def test_strength_zero_is_stock_under_every_schedule(tiny_model):
    model = tiny_model("bert")
    stock = model.encode(TEXTS)
    for schedule in SCHEDULES:
        with pytest.warns(UserWarning, match="strength is 0"):
            zero = model.encode(
                TEXTS, calibration=Calibration(basket_size=8, layers=1.0, strength=0.0, schedule=schedule)
            )
        assert np.abs(zero - stock).max() <= 1e-6


def test_label_spec_words_and_round_trips():
    flat = Calibration(basket_size=128, layers=0.5, strength=1.0)
    assert "schedule" not in flat.to_dict() and flat.label() == "B128-L0.5-a1"
    for schedule in ("rising", "falling"):
        c = Calibration(basket_size=128, layers=0.5, strength=1.0, schedule=schedule)
        assert c.label() == f"B128-L0.5-a1-{schedule}" and c.key() != flat.key()
        assert c.spec() == f"128,0.5,1,schedule={schedule}" and Calibration.parse(c.spec()) == c
        assert Calibration.from_dict(json.loads(json.dumps(c.to_dict()))) == c
        assert f"the strength {schedule} linearly over the calibrated layers" in c.describe()
    assert Calibration.parse("16,1.0,1,schedule=rising,trailing=merge,self=1") == Calibration(
        16, 1.0, 1.0, self_share=1.0, trailing="merge", schedule="rising"
    )
    for spec, match in [
        ("16,1,1,schedule=up", "schedule= in calibration spec '16,1,1,schedule=up' must be flat, rising or falling"),
        ("16,1,1,schedule=rising,schedule=falling", "gives schedule= twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            Calibration.parse(spec)
    with pytest.raises(ValueError, match="schedule must be one of 'flat', 'rising', 'falling'"):
        Calibration(schedule="steep")


def test_saved_model_round_trips_the_schedule_and_loads_it_flag_free(tiny_model_path, tmp_path):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling)
    cal = Calibration(basket_size=8, layers=1.0, strength=1.0, schedule="falling")
    want = model.encode(TEXTS, calibration=cal)
    assert (
        np.abs(want - model.encode(TEXTS, calibration=Calibration(basket_size=8, layers=1.0, strength=1.0))).max()
        > 1e-4
    )
    model.set_calibration(cal).save(str(tmp_path / "saved"))
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["posfair_calibration"]["schedule"] == "falling"
    again = posfair.load_model(str(tmp_path / "saved"))
    assert again.calibration == cal
    np.testing.assert_allclose(again.encode(TEXTS), want, atol=1e-6)
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "saved")).encode(TEXTS), want, atol=1e-5)


def test_the_tuner_searches_schedules_as_a_grid_dimension():
    space = SearchSpace(basket_sizes=(16,), layer_sets=(1.0,), strengths=(0.5, 1.0), fine_rounds=0,
                        schedules=("flat", "rising"), trailings=("basket", "weighted"))  # fmt: skip
    grid = space.coarse()
    assert len(grid) == 2 * 2 * 2 and {(c.schedule, c.trailing) for c in grid} == {
        (s, t) for s in ("flat", "rising") for t in ("basket", "weighted")
    }
    assert space.to_dict()["schedules"] == ["flat", "rising"] and "schedules" not in SearchSpace().to_dict()
    from posfair.runtime.errors import PosfairInputError

    with pytest.raises(PosfairInputError, match="strength schedules must be among flat, rising, falling"):
        SearchSpace(schedules=("steep",))
