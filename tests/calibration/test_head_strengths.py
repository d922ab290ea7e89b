"""Per-head strengths (``Calibration.head_strengths``) and TempScale (``Calibration.temperature``): the basket
functions against hand-built rows and the spec's reference, every attention path against the float64 reference
and against each other, saving and reloading, the string forms, and keys unchanged by default."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

import posfair
import posfair.calibration.cuda_rows as cuda_rows
import posfair.calibration.fused as fused
from posfair import Calibration
from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.coverage import text_settings
from posfair.calibration.params import BasketSettings
from posfair.calibration.rule import row_changes
from reference import fast_and_reference, reference_calibrate_row

TEXTS = [" ".join(["word"] * 25), " ".join(["alpha", "beta"] * 10), "gamma delta " * 6, "short one"]
HEADS4 = (0.0, 1.0, 0.3, 0.75)  # the tiny models have 4 heads


def _rows(H=4, K=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(2, H, K, generator=g, dtype=torch.float64) * 2, -1)


# -- the basket functions ------------------------------------------------------------------------------------


def test_a_head_at_0_is_stock_at_1_full_and_between_the_spec_row():
    a = _rows()
    full = calibrate_rows(a, 0, 11, BasketSettings(basket_size=5, strength=1.0))
    cal = BasketSettings(basket_size=5, head_strength=HEADS4).for_heads((4,), a)
    got = calibrate_rows(a, 0, 11, cal)
    torch.testing.assert_close(got[:, 0], a[:, 0], atol=0, rtol=0)
    torch.testing.assert_close(got[:, 1], full[:, 1], atol=1e-15, rtol=0)
    for b in range(2):
        for h, s in enumerate(HEADS4):
            want = reference_calibrate_row(a[b, h].numpy(), 0, 11, 5, s)
            np.testing.assert_allclose(got[b, h].numpy(), want, atol=1e-14)
    assert float((got[:, 2] - a[:, 2]).abs().max()) > 1e-3  # the rows did change


def test_the_in_place_span_kernel_and_the_variants_take_the_head_vector():
    a = _rows(K=14, seed=1)[:, :, None, :].expand(2, 4, 3, 14).clone()  # (B, H, rows, K): 3 rows per head
    for extra in ({}, {"prior": (2.0, 1.0, 0.5)}, {"isolate_bos": True, "bos_weight": "equal"}):
        cal = BasketSettings(basket_size=4, head_strength=HEADS4, **extra)
        span = a[0].clone()
        calibrate_span_(span, 0, 13, cal.for_heads((4, 1), span))
        for h, s in enumerate(HEADS4):
            plain = BasketSettings(basket_size=4, strength=s, **extra)
            torch.testing.assert_close(span[h], calibrate_rows(a[0, h], 0, 13, plain), atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match="call settings.for_heads"):
        calibrate_rows(a, 0, 13, BasketSettings(basket_size=4, head_strength=HEADS4))
    with pytest.raises(ValueError, match="4 per-head strengths for a layer of 6 attention heads"):
        BasketSettings(basket_size=4, head_strength=HEADS4).for_heads((6,), a)


def test_tempscale_at_1_is_stock_and_otherwise_a_hand_softmax():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 10, generator=g, dtype=torch.float64) * 3
    logits[2, 8:] = -torch.inf  # padding keys: valid span 0..7
    a = torch.softmax(logits, -1)
    end = torch.tensor([9, 9, 7])
    one = calibrate_rows(a, 0, end, BasketSettings(basket_size=4, strength=0.0, temperature=1.0))
    torch.testing.assert_close(one, a, atol=1e-15, rtol=0)
    for T in (0.5, 1.7):
        got = calibrate_rows(a, 0, end, BasketSettings(basket_size=4, strength=0.0, temperature=T))
        hand = torch.exp(logits / T) / torch.exp(logits / T).sum(-1, keepdim=True)
        torch.testing.assert_close(got, hand, atol=1e-14, rtol=0)
        # with the basket formula: the formula on the tempered row
        both = calibrate_rows(a, 0, end, BasketSettings(basket_size=4, strength=0.6, temperature=T))
        torch.testing.assert_close(
            both, calibrate_rows(hand, 0, end, BasketSettings(basket_size=4, strength=0.6)), atol=1e-14, rtol=0
        )
    # a row whose content is shorter than a basket is left stock, as the formula leaves it
    short = calibrate_rows(a, 0, end, BasketSettings(basket_size=9, strength=0.0, temperature=0.5))
    torch.testing.assert_close(short[2], a[2], atol=0, rtol=0)
    assert float((short[0] - a[0]).abs().max()) > 1e-3


def test_the_rule_counts_what_per_head_strengths_and_tempscale_change():
    pooled = dict(isolate_bos=False, isolate_eos=False)
    C = np.array([3, 8, 20])

    def changes(cal: Calibration):
        return row_changes(C, text_settings(cal, "mean"))

    assert not changes(Calibration(8, 1, 0.0, **pooled)).any()
    heads = Calibration(8, (3,), 0.0, head_strengths={3: (0, 0.5)}, **pooled)
    assert changes(heads).tolist() == [0, 0, 1]
    assert row_changes(C, heads.resolve("mean", 4).baskets(3)).tolist() == [0, 0, 1]  # the layer's own setting
    assert not changes(Calibration(8, (3,), 0.0, head_strengths={3: (0, 0)}, **pooled)).any()
    assert not row_changes(C, BasketSettings(8, strength=0.7, head_strength=(0, 0))).any()  # they replace 0.7
    # TempScale changes the one-basket text too (8 keys), never the shorter one
    assert changes(Calibration(8, 1, 0.0, temperature=0.8, **pooled)).tolist() == [0, 1, 1]
    assert not changes(Calibration(8, 1, 0.0, temperature=1.0, **pooled)).any()


# -- the settings: spelling, keys, validation ---------------------------------------------------------------


def test_spelling_round_trips_and_default_keys_stay():
    cal = Calibration(16, (2, 3), 0.5, head_strengths={3: [0.1, 0.123456789], 2: (1, 0)}, temperature=0.8)
    assert cal.head_strengths == ((2, (1.0, 0.0)), (3, (0.1, 0.123456789)))
    assert cal.spec() == "16,2+3,0.5,heads=2:1/0+3:0.1/0.123456789,temp=0.8"
    assert Calibration.parse(cal.spec()) == cal
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert cal.to_dict()["head_strengths"] == {"2": [1.0, 0.0], "3": [0.1, 0.123456789]}
    assert cal.label().startswith("B16-L2+3-a0.5-heads2x2.") and cal.label().endswith("-T0.8")
    assert "per-head strengths in layers 2, 3" in cal.describe() and "temperature 0.8" in cal.describe()
    assert Calibration(temperature=0.8).key() != Calibration().key()
    # a default setting: the keys and labels of before these settings existed
    for plain in (Calibration(), Calibration(16, 1, 1.0), Calibration(64, 0.5, 0.5, self_share=0.2)):
        d = plain.to_dict()
        assert "head_strengths" not in d and "temperature" not in d
        assert "heads" not in plain.label() and "temp" not in plain.spec()
    assert Calibration().key() == "36467cef178a1a7b"


def test_bad_values_are_refused():
    for bad, match in [
        (dict(head_strengths={3: [1.5]}), r"head_strengths\[3\]: every strength must be a number in \[0, 1\]"),
        (dict(head_strengths={3: []}), r"head_strengths\[3\] must be a non-empty sequence"),
        (dict(head_strengths={-1: [0.5]}), "is not a new 0-based index"),
        (dict(head_strengths={}), "must name at least one layer"),
        (dict(temperature=0.0), "temperature must be a finite number > 0"),
        (dict(temperature=float("inf")), "temperature must be a finite number > 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            Calibration(**bad)
    with pytest.raises(ValueError, match=r"head_strengths are given for layers \[1\], which are not calibrated"):
        Calibration(8, 1, 1.0, head_strengths={1: [0.5]}).resolve("mean", 4)
    for spec, match in [("8,1,1,heads=3", "heads= in calibration spec .* must be LAYER:S/S"), ("8,1,1,temp=x", "> 0")]:
        with pytest.raises(ValueError, match=match):
            Calibration.parse(spec)


# -- every attention path -------------------------------------------------------------------------------------


def _per_head_settings(model):
    layers = model.transformer_module.resolve(Calibration(layers=0.5)).layers
    heads = {layers[0]: HEADS4, layers[-1]: (1.0, 0.2, 0.0, 0.6)}
    return [
        Calibration(basket_size=8, layers=0.5, strength=0.9, head_strengths=heads),
        Calibration(basket_size=8, layers=0.5, strength=0.0, temperature=0.6),  # pure TempScale
        Calibration(basket_size=8, layers=0.5, strength=0.7, temperature=1.4, head_strengths={layers[0]: HEADS4}),
    ]


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3", "modernbert"])
def test_every_architecture_matches_the_float64_reference(tiny_model, arch):
    model = tiny_model(arch)
    stock = model.encode(TEXTS, calibration=posfair.STOCK, convert_to_tensor=True)
    for cal in _per_head_settings(model):
        fast, ref = fast_and_reference(model, TEXTS, cal)
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
        assert float((fast - stock).abs().max()) > 1e-4, cal.label()


def test_the_fused_tiled_cuda_rows_and_fallback_paths_agree(tiny_model, monkeypatch):
    model = tiny_model("bert-mean")
    cals = _per_head_settings(model)
    want = [fast_and_reference(model, TEXTS, cal)[1] for cal in cals]

    def check(tag):
        for cal, ref in zip(cals, want, strict=True):
            with torch.no_grad(), model.using(cal):
                got = model(model.tokenize(TEXTS))["sentence_embedding"]
            err = float((got - ref).abs().max())
            assert err <= 1e-5, f"{tag} {cal.label()}: {err}"

    check("fused")
    monkeypatch.setattr(cuda_rows, "cuda_every_row_available", lambda device: True)
    monkeypatch.setattr(fused, "ENABLED", False)
    check("cuda_rows")
    monkeypatch.setattr(cuda_rows, "cuda_every_row_available", lambda device: False)
    check("tiled")


def test_the_fallback_matches_the_reference(remote_model):
    from remote_code_models import assert_every_kind_matches_the_reference

    texts = [" ".join(["word"] * 13), "alpha beta " * 5]
    for pooling in ("cls", "mean"):
        for cal in (
            Calibration(basket_size=4, layers=1.0, strength=0.8, head_strengths={0: (0.0, 1.0, 0.5, 0.25)}),
            Calibration(basket_size=4, layers=1.0, strength=0.0, temperature=0.7),
        ):
            assert_every_kind_matches_the_reference(remote_model, pooling, texts, cal)


def test_saved_model_reloads_the_per_head_strengths_and_the_temperature(tiny_model_path, tmp_path):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling)
    cal = _per_head_settings(model)[2]
    want = model.encode(TEXTS, calibration=cal)
    model.set_calibration(cal).save(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())["posfair_calibration"]
    assert saved["head_strengths"] == {str(cal.head_strengths[0][0]): list(HEADS4)} and saved["temperature"] == 1.4
    again = posfair.load_model(str(tmp_path / "saved"))
    assert again.calibration == cal
    np.testing.assert_allclose(again.encode(TEXTS), want, atol=1e-6)
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "saved")).encode(TEXTS), want, atol=1e-5)
