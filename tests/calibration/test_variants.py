"""The calibration variants (issue 16): positional prior, self-attention share, special-token mass.

Hand-computed rows (padding, isolated keys, zero-mass baskets), strength 0 = stock, the
in-place span function against the row function, the independent slow reference on tiny
models, validation, the command-line form and the saved-model round trip.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import posfair
from posfair import Calibration
from posfair.attention.prior_estimate import estimate_prior, row_density
from posfair.calibration.baskets import calibrate_rows, calibrate_span_, prior_at
from posfair.calibration.params import BasketSettings, PositionalPrior
from reference import reference_calibrate_row, reference_mode

ROW = [0.1, 0.4, 0.2, 0.1, 0.2, 0.0]  # valid keys 0..4, key 5 padding


def t(x):
    return torch.tensor([x], dtype=torch.float64)


# -- positional prior ------------------------------------------------------------------------------
def test_prior_at_interpolates_between_bin_centres_and_is_flat_outside():
    x = torch.tensor([0.0, 0.25, 0.5, 0.6, 0.75, 1.0], dtype=torch.float64)
    got = prior_at([1.0, 2.0], x)
    assert got.tolist() == pytest.approx([1.0, 1.0, 1.5, 1.7, 2.0, 2.0])
    assert prior_at([3.0], x).tolist() == [3.0] * 6


def test_prior_row_by_hand():
    # C=5, B=2: baskets {0,1} {2,3} {4}; centres (relative): 1/5, 3/5, 4.5/5 -> prior [1, 2] gives 1, 1.7, 2
    # masses 0.5, 0.3, 0.2 -> 0.5/1, 0.3/1.7, 0.2/2, renormalised
    m = np.array([0.5, 0.3 / 1.7, 0.1])
    share = m / m.sum()
    want = [0.1 / 0.5 * share[0], 0.4 / 0.5 * share[0], 0.2 / 0.3 * share[1], 0.1 / 0.3 * share[1], share[2], 0.0]
    got = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, prior=[1.0, 2.0]))
    assert got[0].tolist() == pytest.approx(want, abs=1e-12)


def test_flat_prior_leaves_the_row_alone_and_is_scale_free():
    a = t(ROW)
    assert torch.allclose(calibrate_rows(a, 0, 4, BasketSettings(basket_size=2, prior=[5.0, 5.0, 5.0])), a, atol=1e-15)
    one = calibrate_rows(a, 0, 4, BasketSettings(basket_size=2, prior=[1.0, 3.0]))
    assert torch.allclose(one, calibrate_rows(a, 0, 4, BasketSettings(basket_size=2, prior=[10.0, 30.0])), atol=1e-15)


def test_prior_with_left_padding_isolated_bos_and_a_zero_mass_basket():
    # keys 0,1 padding; span 2..8; BOS at 2 isolated ("original": keeps 0.3); content 3..8 in baskets of 2
    a = [0.0, 0.0, 0.3, 0.0, 0.0, 0.2, 0.1, 0.25, 0.15]
    prior = [2.0, 1.0, 1.0]
    got = calibrate_rows(t(a), 2, 8, BasketSettings(basket_size=2, isolate_bos=True, prior=prior))[0].numpy()
    # content C=6, baskets {3,4} (mass 0: stays 0) {5,6} {7,8}; centres 1/6, 3/6, 5/6 -> prior 2, 1, 1 (flat beyond the last centre)
    p = [reference_prior_value(prior, x) for x in (1 / 6, 3 / 6, 5 / 6)]
    assert p == pytest.approx([2.0, 1.0, 1.0])
    targets = np.array([0.0, 0.3 / 1.0, 0.4 / 1.0])
    targets = targets / targets.sum() * 0.7
    want = [
        0,
        0,
        0.3,
        0,
        0,
        0.2 / 0.3 * targets[1],
        0.1 / 0.3 * targets[1],
        0.25 / 0.4 * targets[2],
        0.15 / 0.4 * targets[2],
    ]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert got.sum() == pytest.approx(1.0)


def reference_prior_value(prior, x):
    from reference import reference_prior

    return reference_prior(prior, x)


# -- self-attention share ---------------------------------------------------------------------------
def test_self_share_row_by_hand():
    # own key 1 (0.4) keeps rho * 0.4; the rest calibrated without it: baskets {0,1}->0.1, {2,3}->0.3, {4}->0.2
    for rho in (1.0, 0.5, 0.0):
        keep = rho * 0.4
        rest = np.array([1 / 3, 0.0, 2 / 9, 1 / 9, 1 / 3]) * (1 - keep)
        want = list(rest) + [0.0]
        want[1] = keep
        got = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, self_share=rho), self_key=1)[0]
        assert got.tolist() == pytest.approx(want, abs=1e-12), rho


def test_self_share_of_an_isolated_pooling_key_overrides_its_weight():
    # CLS pooling: the own key is the isolated BOS key 0 (weight "equal" would give it 1/4); rho=0.5 keeps 0.05
    got = calibrate_rows(
        t(ROW), 0, 4, BasketSettings(basket_size=2, isolate_bos=True, bos_weight="equal", self_share=0.5), self_key=0
    )[0]
    # content 1..4: baskets {1,2} 0.6, {3,4} 0.3 -> each (1 - 0.05)/2
    each = 0.95 / 2
    assert got.tolist() == pytest.approx(
        [0.05, 0.4 / 0.6 * each, 0.2 / 0.6 * each, 0.1 / 0.3 * each, 0.2 / 0.3 * each, 0.0], abs=1e-12
    )


def test_self_share_row_all_on_itself_and_padding_query_rows():
    a = t([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert (
        calibrate_rows(a, 0, 4, BasketSettings(basket_size=2, self_share=0.0), self_key=1).tolist() == a.tolist()
    )  # nothing else to carry mass
    # a padding query row (own key 5 outside the span) gets the plain formula
    plain = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2))
    assert torch.equal(calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, self_share=0.3), self_key=5), plain)
    with pytest.raises(ValueError, match="self_key"):
        calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, self_share=0.3))


# -- special-token mass -------------------------------------------------------------------------------
def test_special_token_mass_by_hand():
    cal = Calibration(basket_size=2, layers=1, strength=1.0).with_special(0.1)
    assert cal.variant == "special" and cal.isolate_bos and cal.isolate_eos and cal.bos_weight == cal.eos_weight == 0.1
    got = calibrate_rows(t(ROW), 0, 4, cal.resolve("mean", 2).baskets(1))[0]
    # BOS 0 and EOS 4 get 0.1 each; content 1..3: baskets {1,2} 0.6, {3} 0.1 -> 0.4 each
    assert got.tolist() == pytest.approx([0.1, 0.4 / 0.6 * 0.4, 0.2 / 0.6 * 0.4, 0.4, 0.1, 0.0], abs=1e-12)
    kept = Calibration(basket_size=2, layers=1, strength=1.0).with_special("original")
    got = calibrate_rows(t(ROW), 0, 4, kept.resolve("mean", 2).baskets(1))[0]
    assert got.tolist() == pytest.approx([0.1, 0.4 / 0.6 * 0.35, 0.2 / 0.6 * 0.35, 0.35, 0.2, 0.0], abs=1e-12)


# -- every variant: strength 0, the span function, random rows against the reference loop -----------
VARIANTS = [
    dict(prior=[3.0, 1.0, 0.5, 2.0]),
    dict(self_share=0.5),
    dict(self_share=1.0, prior=[1.0, 2.0]),
    dict(isolate_bos=True, isolate_eos=True, bos_weight=0.05, eos_weight=0.05),
    dict(isolate_bos=True, bos_weight="equal", self_share=0.25),
]


@pytest.mark.parametrize("kw", VARIANTS)
def test_variants_strength_zero_span_and_reference(kw):
    rng = np.random.default_rng(0)
    K, T = 12, 12
    probs = torch.from_numpy(rng.dirichlet(np.ones(K) * 0.5, size=(2, T)))
    probs[:, :, 10:] = 0.0  # keys 10, 11 padding
    probs[:, :, 3:5] = 0.0  # a zero-mass basket for B=2 with content starting at 1 or 0
    probs = probs / probs.sum(-1, keepdim=True)
    rows = torch.arange(T).view(1, T).expand(2, T)
    self_key = rows if "self_share" in kw else None
    zero = calibrate_rows(probs, 0, 9, BasketSettings(basket_size=2, strength=0.0, **kw), self_key=self_key)
    assert torch.equal(zero, probs)
    for strength in (0.5, 1.0):
        settings = BasketSettings(basket_size=2, strength=strength, **kw)
        got = calibrate_rows(probs, 0, 9, settings, self_key=self_key)
        span = probs.clone()
        calibrate_span_(span, 0, 9, settings)
        torch.testing.assert_close(span, got, atol=1e-14, rtol=0)
        ref_kw = {
            "iso_bos": kw.get("isolate_bos", False), "iso_eos": kw.get("isolate_eos", False),
            "bos_w": kw.get("bos_weight", "original"), "eos_w": kw.get("eos_weight", "equal"),
            "prior": kw.get("prior"), "self_share": kw.get("self_share"),
        }  # fmt: skip
        for b in range(2):
            for r in range(T):
                want = reference_calibrate_row(probs[b, r].numpy(), 0, 9, 2, strength, self_key=r, **ref_kw)
                np.testing.assert_allclose(got[b, r].numpy(), want, atol=1e-12)
                assert got[b, r].sum().item() == pytest.approx(1.0)


# -- the encoder against the independent slow reference (tiny models) -------------------------------
TEXTS = [
    ("alpha beta gamma delta epsilon zeta eta theta " * 9).strip(),
    "iota kappa lambda mu " * 3,
    "nu xi omicron pi rho " * 7,
]


def _assert_reference(model, cal):
    features = model.tokenize(TEXTS)
    with torch.no_grad(), model.using(cal):
        fast = model(features)["sentence_embedding"]
    with torch.no_grad(), reference_mode(model, model.transformer_module.resolve(cal), features["attention_mask"]):
        ref = model(model.tokenize(TEXTS))["sentence_embedding"]
    with torch.no_grad():
        stock = model(model.tokenize(TEXTS))["sentence_embedding"]
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
    assert float((fast - stock).abs().max()) > 1e-4  # the variant really changed the embeddings


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3"])
def test_variants_match_the_slow_reference(tiny_model, arch):
    model = tiny_model(arch)
    layers = model.transformer_module.resolve(Calibration()).layers
    prior = PositionalPrior(values=tuple((3.0, 1.5, 1.0, 0.5, 1.0 + i) for i in range(len(layers))), layers=layers)
    base = Calibration(basket_size=8, layers=0.5, strength=0.8)
    for cal in (
        Calibration(basket_size=8, layers=0.5, strength=0.8, prior=prior),
        Calibration(basket_size=8, layers=0.5, strength=0.8, self_share=0.5),
        base.with_special(0.05),
        # the combinations the tuner searches
        Calibration(basket_size=8, layers=0.5, strength=0.8, prior=prior).with_special("original"),
        Calibration(basket_size=8, layers=0.5, strength=0.8, self_share=1.0).with_special(0.05),
        Calibration(basket_size=8, layers=0.5, strength=0.6, prior=prior, self_share=0.5).with_special("equal"),
    ):
        _assert_reference(model, cal)


@pytest.mark.filterwarnings("ignore::posfair.calibration.coverage.CalibrationFallbackWarning")
def test_variants_strength_zero_is_the_stock_model(tiny_model):
    model = tiny_model(
        "bert-mean"
    )  # every row calibrated: the explicit path (stock up to float rounding, as in test_engine)
    stock = model.encode(TEXTS, convert_to_tensor=True)
    for cal in (Calibration(basket_size=8, layers=0.5, strength=0.0, prior={"values": [[2.0, 1.0]]}),
                Calibration(basket_size=8, layers=0.5, strength=0.0, self_share=0.3)):  # fmt: skip
        assert float((model.encode(TEXTS, calibration=cal, convert_to_tensor=True) - stock).abs().max()) <= 1e-6


# -- parameters: validation, keys, the command-line form, persistence ----------------------------------
def test_defaults_keep_their_dict_and_label():
    for cal in (
        Calibration(),
        Calibration(basket_size=16, layers=(1, 2), strength=1.0, isolate_bos=True, bos_weight=0.1),
    ):
        assert "prior" not in cal.to_dict() and "self_share" not in cal.to_dict()
        assert "prior" not in cal.label() and "self" not in cal.label()
        assert cal.variant == "uniform"
    with_prior = Calibration(prior={"values": [[1.0, 2.0]]})
    assert with_prior.key() != Calibration().key() and with_prior.label().startswith("B128-L0.5-a0.5-prior2x1.")
    assert Calibration(self_share=0.5).label() == "B128-L0.5-a0.5-self0.5"
    assert Calibration(prior={"values": [[1.0, 2.0]]}).label() != Calibration(prior={"values": [[1.0, 3.0]]}).label()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(self_share=1.5), "self_share"),
        (dict(self_share=True), "self_share"),
        (dict(prior={"values": [[1.0, 0.0]]}), "> 0"),
        (dict(prior={"values": [[1.0, float("nan")]]}), "> 0"),
        (dict(prior={"values": [[1.0], [1.0]]}), "needs their layers"),
        (dict(prior={"values": [[1.0, 2.0], [1.0]], "layers": [0, 1]}), "same number of bins"),
        (dict(prior={"values": [[1.0]], "layers": [0, 1]}), "1 vectors for 2 layers"),
        (dict(prior={"values": [[1.0]], "bogus": 1}), "unknown positional prior"),
    ],
)
def test_invalid_variants_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        Calibration(**kw)


def test_per_layer_prior_must_cover_the_calibrated_layers():
    cal = Calibration(layers=2, prior={"values": [[1.0], [2.0]], "layers": [4, 5]})
    assert cal.resolve("mean", 6).baskets(5).prior == (2.0,)
    with pytest.raises(ValueError, match="also calibrates layers \\[3\\]"):
        Calibration(layers=3, prior={"values": [[1.0], [2.0]], "layers": [4, 5]}).resolve("mean", 6)


def test_command_line_form(tmp_path):
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"prior": {"layers": None, "values": [[2.0, 1.0]]}, "documents": 3}))
    cal = Calibration.parse(f"16,1,1,prior={path},self=0.5,special=original")
    assert (
        cal.prior.values == ((2.0, 1.0),) and cal.self_share == 0.5 and cal.isolate_bos and cal.eos_weight == "original"
    )
    assert Calibration.parse(cal.spec(str(path))) == cal
    assert Calibration.parse("16,1,1,special=0.1").variant == "special"
    for spec, match in [
        ("16,1,1,self=x", "self="),
        ("16,1,1,special=big", "special="),
        ("16,1,1,colour=red", "unknown variant"),
        (f"16,1,1,prior={tmp_path / 'missing.json'}", "does not exist"),
        ("16,1,self=0.5,1", "BASKET,LAYERS,STRENGTH"),
    ]:
        with pytest.raises(ValueError, match=match):
            Calibration.parse(spec)


def test_saved_model_round_trips_the_variants(tiny_model_path, tmp_path):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling)
    layers = model.transformer_module.resolve(Calibration()).layers
    prior = {"values": [[2.0, 1.0, 0.5 + i] for i in range(len(layers))], "layers": list(layers)}
    cal = Calibration(basket_size=8, strength=0.9, prior=prior, self_share=0.4, isolate_bos=True, isolate_eos=True,
                      bos_weight=0.05, eos_weight=0.05)  # fmt: skip
    want = model.encode(TEXTS, calibration=cal, convert_to_tensor=True)
    model.set_calibration(cal).save(str(tmp_path / "saved"))
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["posfair_calibration"]["prior"] == {
        "layers": list(layers),
        "values": prior["values"],
    }  # plain JSON numbers
    again = posfair.load_model(str(tmp_path / "saved"))
    assert again.calibration == cal
    torch.testing.assert_close(again.encode(TEXTS, convert_to_tensor=True), want, atol=1e-6, rtol=0)


# -- estimating the prior -------------------------------------------------------------------------------
def test_row_density_by_hand():
    # C=4, 2 bins: keys 0,1 -> bin 0; 2,3 -> bin 1; masses 0.3+0.3 vs 0.1+0.1 (of 0.8): density 1.5 and 0.5
    assert row_density(np.array([0.3, 0.3, 0.1, 0.1]), 2).tolist() == pytest.approx([1.5, 0.5])
    # C=5, 2 bins: keys 0,1 (rel .1, .3) -> bin 0; 2,3,4 -> bin 1 (rel .5 -> floor(1.0) = 1)
    assert row_density(np.full(5, 0.2), 2).tolist() == pytest.approx([1.0, 1.0])


def test_estimate_prior_matches_a_manual_average(tiny_model):
    model = tiny_model("bert")  # CLS pooling: the pooling row, BOS isolated
    docs = TEXTS[:1] + TEXTS[2:]
    est = estimate_prior(model, docs, Calibration(basket_size=8, layers=2), bins=4)
    assert est.documents == 2 and est.skipped == 0 and est.calibration.prior.layers == (2, 3)
    rows = {}
    with (
        torch.no_grad(),
        model.recording_attention(lambda layer, r: rows.setdefault(layer, []).append(r.mean(1)), [2, 3]),
    ):
        for d in docs:
            model(model.tokenize([d]))
    for li, layer in enumerate((2, 3)):
        dens = [row_density(r[0, 1:].double().numpy(), 4) for r in rows[layer]]  # BOS at 0 isolated, no EOS isolation
        np.testing.assert_allclose(est.calibration.prior.values[li], np.mean(dens, 0), rtol=1e-5)
    with pytest.raises(posfair.runtime.errors.PosfairInputError, match="no document has 500 content keys"):
        estimate_prior(model, ["short text"], bins=500)
