"""The trailing-basket policy (``Calibration.trailing``, issue 27 item 5): what a last content basket
shorter than B gets.  ``"basket"`` (the papers', default): a basket like the others; ``"merge"``: it
joins the basket before it (``max(1, floor(C / B))`` baskets); ``"weighted"``: each basket's target
mass is proportional to its number of keys.

Hand-computed masses (5 keys, B=2: slots of 2, 2, 1 keys), the basket functions and every backend
against the independent float64 reference (``tests/reference.py``) on tiny models, the one extra
token on the bundled MiniLM (129 vs 128 tokens at B=128), the rule, persistence and the command line.
"""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

import posfair
import posfair.calibration.fused as fused
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.baskets import basket_weights, calibrate_rows, calibrate_span_
from posfair.calibration.coverage import calibrated_mask, calibration_coverage
from posfair.calibration.params import TRAILING, BasketSettings, PositionalPrior
from posfair.calibration.rule import basket_count
from reference import fast_and_reference, reference_calibrate_row, reference_prior
from tiny_models import ARCHS, eager_attention, skip_without_registry

ROW = [0.1, 0.4, 0.2, 0.1, 0.2, 0.0]  # valid keys 0..4 (C = 5, B = 2: slots {0,1} {2,3} {4}), key 5 padding
#: the basket masses by hand: slot masses 0.5, 0.3, 0.2
HAND = {
    "basket": [1 / 3, 1 / 3, 1 / 3],  # three baskets, equal mass
    "merge": [1 / 2, 1 / 2],  # {0,1} and {2,3,4}: the 1-key trailing basket joined the one before
    "weighted": [2 / 5, 2 / 5, 1 / 5],  # mass proportional to 2, 2, 1 keys
}
BASKETS = {"basket": [[0, 1], [2, 3], [4]], "merge": [[0, 1], [2, 3, 4]], "weighted": [[0, 1], [2, 3], [4]]}


def t(x):
    return torch.tensor([x], dtype=torch.float64)


def by_hand(policy: str, strength: float = 1.0) -> list[float]:
    row = np.array(ROW)
    out = np.zeros_like(row)
    for keys, target in zip(BASKETS[policy], HAND[policy], strict=True):
        out[keys] = row[keys] / row[keys].sum() * target
    return list(strength * out + (1 - strength) * row)


# -- by hand ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", TRAILING)
@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_five_keys_in_baskets_of_two_by_hand(policy, strength):
    want = by_hand(policy, strength)
    got = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, strength=strength, trailing=policy))[0]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    span = calibrate_span_(t(ROW), 0, 4, BasketSettings(basket_size=2, strength=strength, trailing=policy))[0]
    assert span.tolist() == pytest.approx(want, abs=1e-12)
    assert reference_calibrate_row(ROW, 0, 4, 2, strength, trailing=policy).tolist() == pytest.approx(want, abs=1e-12)
    # basket_weights on the slot masses: what each slot weighs afterwards (the fused path's formula)
    w, _, _ = basket_weights(
        torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64),
        3,
        None,
        None,
        BasketSettings(strength=strength, trailing=policy, basket_size=2),
        n_content=5,
    )
    slot_want = [sum(want[k] for k in keys) for keys in ([0, 1], [2, 3], [4])]
    assert w.tolist() == pytest.approx(slot_want, abs=1e-12)


def test_the_policies_differ_only_with_a_short_trailing_basket():
    # merge: the merged basket {2,3,4} has the 0.5 it already had, so the row is unchanged here
    assert by_hand("merge") == pytest.approx(ROW)
    # C = 4 (keys 0..3): two full baskets, every policy is the papers' formula
    row = [0.1, 0.4, 0.2, 0.3, 0.0, 0.0]
    outs = [calibrate_rows(t(row), 0, 3, BasketSettings(basket_size=2, trailing=p)) for p in TRAILING]
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_equal_isolated_share_counts_the_policys_baskets():
    # EOS (key 5) isolated with "equal"; content 0..4 in slots 2, 2, 1 (masses 0.45, 0.27, 0.18 of a row with EOS 0.1)
    row = [0.09, 0.36, 0.18, 0.09, 0.18, 0.1]
    kw = dict(basket_size=2, isolate_eos=True, eos_weight="equal")
    # basket: 3 baskets + EOS = 4 units, 1/4 each; merge: 2 + 1 = 3 units, 1/3 each;
    # weighted: 5/2 + 1 = 3.5 units: EOS 1/3.5 = 2/7, the baskets 2/7, 2/7 and 1/7 (half a basket)
    for policy, slots, eos in [
        ("basket", [1 / 4, 1 / 4, 1 / 4], 1 / 4),
        ("merge", [1 / 3 * 0.27 / 0.45, 1 / 3 * 0.18 / 0.45], 1 / 3),
        ("weighted", [2 / 7, 2 / 7, 1 / 7], 2 / 7),
    ]:
        got = calibrate_rows(t(row), 0, 5, BasketSettings(trailing=policy, **kw))[0].numpy()
        assert got[5] == pytest.approx(eos, abs=1e-12), policy
        assert got[0] + got[1] == pytest.approx(1 / 3 if policy == "merge" else slots[0], abs=1e-12), policy
        assert got[0] / got[1] == pytest.approx(0.25)  # proportions inside a basket kept
        if policy == "merge":  # {2,3,4} is one basket of 1/3, proportions 0.18 : 0.09 : 0.18
            assert got[2:5].tolist() == pytest.approx([1 / 3 * 0.4, 1 / 3 * 0.2, 1 / 3 * 0.4], abs=1e-12)
        else:
            assert [got[2] + got[3], got[4]] == pytest.approx(slots[1:], abs=1e-12), policy
        assert got.sum() == pytest.approx(1.0)


def test_prior_with_merge_uses_the_merged_baskets_centre_and_weighted_only_the_equal_share():
    # prior [1, 2] (bin centres 0.25, 0.75); C=5, B=2
    prior = [1.0, 2.0]
    # merge: {0,1} centre key 0.5 -> (0.5 + 0.5) / 5 = 0.2 -> 1.0; {2,3,4} centre key 3 -> 3.5 / 5 = 0.7 -> 1.9
    assert reference_prior(prior, 0.2) == 1.0 and reference_prior(prior, 0.7) == pytest.approx(1.9)
    tilted = np.array([0.5 / 1.0, 0.5 / 1.9])
    share = tilted / tilted.sum()
    want = [
        0.1 / 0.5 * share[0],
        0.4 / 0.5 * share[0],
        0.2 / 0.5 * share[1],
        0.1 / 0.5 * share[1],
        0.2 / 0.5 * share[1],
        0,
    ]
    got = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, prior=prior, trailing="merge"))[0]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    # weighted: m_b / p_b already scales with the basket's size, so without an "equal" share it is "basket"
    plain = calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, prior=prior))
    assert torch.allclose(
        calibrate_rows(t(ROW), 0, 4, BasketSettings(basket_size=2, prior=prior, trailing="weighted")), plain
    )


def test_basket_count():
    C = np.array([4, 5, 7, 8, 9, 15, 16, 17])
    assert basket_count(C, 8, "basket").tolist() == [1, 1, 1, 1, 2, 2, 2, 3]
    assert basket_count(C, 8, "weighted").tolist() == [1, 1, 1, 1, 2, 2, 2, 3]
    assert basket_count(C, 8, "merge").tolist() == [1, 1, 1, 1, 1, 1, 2, 2]
    assert basket_count(torch.tensor(C), 8, "merge").tolist() == [1, 1, 1, 1, 1, 1, 2, 2]
    assert basket_count(23, 8, "merge") == 2


# -- the basket functions against the float64 reference, every variant ------------------------------------
VARIANTS = [
    {},
    dict(isolate_bos=True),
    dict(isolate_bos=True, bos_weight="equal"),
    dict(isolate_bos=True, isolate_eos=True, bos_weight=0.1, eos_weight=0.05),
    dict(isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight="equal"),
    dict(prior=[3.0, 1.0, 0.5, 2.0]),
    dict(isolate_bos=True, isolate_eos=True, prior=[0.2, 4.0]),
    dict(self_share=0.5),
    dict(isolate_bos=True, bos_weight="equal", self_share=0.25),
    dict(isolate_eos=True, eos_weight="equal", prior=[1.0, 3.0], self_share=1.0),
]


@pytest.mark.parametrize("policy", TRAILING)
@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "uniform")
def test_basket_functions_match_the_reference(policy, kw):
    """calibrate_rows and calibrate_span_ == the loop reference, every content length 1..3B+2 (every
    trailing length), right and left padding, a zero-mass basket, strengths 0.5 and 1."""
    rng = np.random.default_rng(len(str(kw)))
    B, K = 4, 20
    ref_kw = {
        "iso_bos": kw.get("isolate_bos", False), "iso_eos": kw.get("isolate_eos", False),
        "bos_w": kw.get("bos_weight", "original"), "eos_w": kw.get("eos_weight", "equal"),
        "prior": kw.get("prior"), "self_share": kw.get("self_share"), "trailing": policy,
    }  # fmt: skip
    for n, strength in itertools.product(range(1, K + 1), (0.5, 1.0)):
        for s in (0, K - n):
            e = s + n - 1
            rows = np.zeros((n, K))
            rows[:, s : e + 1] = rng.dirichlet(np.ones(n) * 0.7, size=n)
            if n > 6:
                rows[0, s + 1 : s + 5] = 0.0  # a zero-mass basket
                rows[0] /= rows[0].sum()
            a = torch.tensor(rows)
            qrows = torch.arange(s, e + 1)
            settings = BasketSettings(basket_size=B, strength=strength, trailing=policy, **kw)
            got = calibrate_rows(a, s, e, settings, self_key=qrows if "self_share" in kw else None)
            span = calibrate_span_(a.clone(), s, e, settings, row_offset=s)
            for r in range(n):
                want = reference_calibrate_row(rows[r], s, e, B, strength, self_key=s + r, **ref_kw)
                np.testing.assert_allclose(got[r].numpy(), want, atol=1e-12, err_msg=f"n={n} s={s} row {r}")
                np.testing.assert_allclose(span[r].numpy(), want, atol=1e-12, err_msg=f"span n={n} s={s} row {r}")


# -- every backend against the float64 reference on tiny models --------------------------------------------
def _texts(B: int) -> list[str]:
    # a padded batch: 3B + 3 tokens (a trailing basket of 3, 2 or 1 content keys with 0, 1 or 2 isolated
    # keys), 2B + B/2 + 2 tokens of other words, and a text shorter than one basket
    return [" ".join(["word"] * (3 * B + 1)), " ".join(["alpha", "beta"] * (B + B // 4)), "gamma delta"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_matches_the_reference(tiny_model, arch):
    """Registry kernels (pooling row; fused and tiled all-rows for mean pooling) == the float64 reference,
    and the three policies give three different embeddings."""
    model = tiny_model(arch)
    texts = _texts(8)
    got = {}
    for policy in TRAILING:
        cal = Calibration(basket_size=8, layers=0.5, strength=1.0, trailing=policy)
        fast, ref = fast_and_reference(model, texts, cal)
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
        got[policy] = fast
    for a, b in itertools.combinations(TRAILING, 2):
        assert float((got[a] - got[b]).abs().max()) > 1e-4, (a, b)


@pytest.mark.parametrize("policy", ["merge", "weighted"])
def test_tiled_all_rows_path_matches_the_reference(tiny_model, monkeypatch, policy):
    model = tiny_model("bert-mean")
    texts = _texts(8)
    cal = Calibration(basket_size=8, layers=0.5, strength=0.8, trailing=policy)
    fast, ref = fast_and_reference(model, texts, cal)
    monkeypatch.setattr(fused, "ENABLED", False)
    tiled, _ = fast_and_reference(model, texts, cal)
    torch.testing.assert_close(tiled, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("policy", ["merge", "weighted"])
def test_eager_explicit_path_matches_the_reference(tiny_model, policy):
    model = tiny_model("bert-mean")
    skip_without_registry(model, "bert-mean", "the intercepted-SDPA tests below cover that stack")
    texts = _texts(8)
    cal = Calibration(basket_size=8, layers=0.5, strength=0.8, trailing=policy)
    _, ref = fast_and_reference(model, texts, cal)
    with eager_attention(model):
        eager, _ = fast_and_reference(model, texts, cal)
    torch.testing.assert_close(eager, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3"])
def test_intercepted_sdpa_fallback_matches_the_registry(tiny_model, tiny_model_path, arch):
    """The fallback backend (stock SDPA intercepted) gives the registry's numbers (checked against the reference above)."""
    model = tiny_model(arch)
    path, pooling = tiny_model_path(arch)
    other = posfair.load_model(path, pooling=pooling)
    tm = other.transformer_module
    tm.auto_model.set_attn_implementation("sdpa")
    tm.reprobe()  # probe again: now the fallback
    texts = _texts(8)
    for policy in ("merge", "weighted"):
        cal = Calibration(basket_size=8, layers=0.5, strength=1.0, trailing=policy)
        features = model.tokenize(texts)
        with torch.no_grad(), model.using(cal):
            a = model(features)["sentence_embedding"]
        with torch.no_grad(), other.using(cal):
            b = other(other.tokenize(texts))["sentence_embedding"]
        assert other.mechanism == "fallback"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_remote_code_softmax_and_sdpa_match_the_reference(remote_model, pooling):
    """The fallback's softmax and SDPA interception on remote-code models == the remote models' float64 reference."""
    from remote_code_models import assert_every_kind_matches_the_reference

    for policy in ("merge", "weighted"):
        cal = Calibration(basket_size=4, layers=0.75, strength=1.0, trailing=policy)
        assert_every_kind_matches_the_reference(remote_model, pooling, _texts(4), cal)


@pytest.mark.parametrize("arch", ["bert", "bert-mean", "qwen3"])
def test_variants_with_a_policy_match_the_reference(tiny_model, arch):
    model = tiny_model(arch)
    layers = model.transformer_module.resolve(Calibration()).layers
    prior = PositionalPrior(values=tuple((3.0, 1.5, 1.0, 0.5, 1.0 + i) for i in range(len(layers))), layers=layers)
    texts = _texts(8)
    for policy in ("merge", "weighted"):
        base = Calibration(basket_size=8, layers=0.5, strength=0.8, trailing=policy)
        for cal in (
            Calibration(basket_size=8, layers=0.5, strength=0.8, prior=prior, trailing=policy),
            Calibration(basket_size=8, layers=0.5, strength=0.8, self_share=0.5, trailing=policy),
            base.with_special("equal"),
        ):
            fast, ref = fast_and_reference(model, texts, cal)
            torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)


# -- one extra token (the case) on the bundled MiniLM -------------------------------------------------
SENTENCE = "the cat sat on the mat and the dog ran in the park with a red ball"


def _words(n_tokens: int) -> str:
    words = (SENTENCE.split() * 20)[: n_tokens - 2]  # + [CLS] and [SEP]
    return " ".join(words)


def test_one_extra_token_does_not_flip_a_text_with_merge(minilm):
    """Mean pooling, B=128, strength 1: a 129-token text (specials included) has a last basket of one
    token ([SEP]).  "basket" gives it half the mass and moves the embedding far from stock; "merge" makes
    it one basket (stock); "weighted" gives it 1/129 and stays near stock.  A 128-token text is stock."""
    texts = [_words(128), _words(129)]
    assert minilm.encoded_lengths(texts).tolist() == [128, 129]
    stock = minilm.encode(texts, calibration=STOCK)
    change = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for policy in TRAILING:
            cal = Calibration(basket_size=128, layers=0.5, strength=1.0, trailing=policy)
            got = minilm.encode(texts, calibration=cal)
            assert np.abs(got[0] - stock[0]).max() <= 1e-6, policy  # one basket: stock under every policy
            change[policy] = float(np.abs(got[1] - stock[1]).max())
            assert bool(calibrated_mask(cal, [129], "mean")[0]) == (policy != "merge")
    assert change["basket"] > 0.1, change  # the flip the issue describes
    assert change["merge"] <= 1e-6, change  # the short basket joined the first: one basket, stock
    assert 1e-6 < change["weighted"] < change["basket"] / 10, change


def test_merge_moves_the_change_to_two_full_baskets(tiny_model):
    """With "merge" the first calibrated length is C = 2B (two baskets of B), not B + 1."""
    model = tiny_model("bert-mean")
    cal = Calibration(basket_size=16, layers=1.0, strength=1.0, trailing="merge")
    for n, changed in ((17, False), (31, False), (32, True), (33, True)):
        text = " ".join(["word"] * (n - 2))
        assert model.encoded_lengths([text]).tolist() == [n]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            diff = np.abs(model.encode([text], calibration=cal) - model.encode([text], calibration=STOCK)).max()
        assert (diff > 1e-6) == changed == bool(calibrated_mask(cal, [n], "mean")[0]), n


# -- the rule and the counts ------------------------------------------------------------------------------------
def test_coverage_counts_follow_the_policy():
    n = [7, 8, 9, 15, 16, 17]  # mean pooling: C = n
    for policy, calibrated in (("basket", 4), ("weighted", 4), ("merge", 2)):
        cov = calibration_coverage(Calibration(basket_size=8, strength=1.0, trailing=policy), n, "mean")
        assert (cov.shorter, cov.one_basket, cov.calibrated) == (1, 5 - calibrated, calibrated), policy
    cov = calibration_coverage(Calibration(basket_size=8, strength=1.0, trailing="merge"), n, "mean")
    assert "3 fill one basket (a short last basket merged into it)" in cov.message()
    # an isolated key given a new share changes a one-basket text under every policy
    special = Calibration(basket_size=8, strength=1.0, trailing="merge").with_special("equal")
    assert calibration_coverage(special, [10, 17], "mean").calibrated == 2  # C = 8, 15


# -- parameters: validation, dict, label, command line, saved model -------------------------------------------
def test_validation_names_the_field_and_the_values():
    for bad in ("last", "", None, 1, "Merge"):
        with pytest.raises(ValueError, match="trailing must be one of 'basket', 'merge', 'weighted'"):
            Calibration(trailing=bad)


def test_default_keeps_its_dict_key_label_and_spec():
    cal = Calibration()
    assert "trailing" not in cal.to_dict() and cal.label() == "B128-L0.5-a0.5" and cal.spec() == "128,0.5,0.5"
    assert Calibration(trailing="basket") == cal and Calibration(trailing="basket").key() == cal.key()
    assert Calibration.from_dict({**cal.to_dict(), "trailing": "basket"}) == cal
    for policy in ("merge", "weighted"):
        c = Calibration(basket_size=128, strength=1.0, trailing=policy)
        assert c.to_dict()["trailing"] == policy and c.key() != Calibration(basket_size=128, strength=1.0).key()
        assert c.label() == f"B128-L0.5-a1-trail{policy}"
        assert Calibration.from_dict(json.loads(json.dumps(c.to_dict()))) == c
        assert Calibration.parse(c.spec()) == c and c.spec() == f"128,0.5,1,trailing={policy}"
        assert c.resolve("mean", 6).trailing == policy and c.resolve("mean", 6).baskets(5).trailing == policy
    assert cal.resolve("mean", 6).baskets(5).trailing == "basket"
    assert "merged into the one before" in Calibration(trailing="merge").describe()
    assert "in proportion to its size" in Calibration(trailing="weighted").describe()


def test_command_line_form():
    assert Calibration.parse("16,1,1,trailing=merge,self=0.5") == Calibration(16, 1, 1.0, self_share=0.5,
                                                                              trailing="merge")  # fmt: skip
    for spec, match in [
        (
            "16,1,1,trailing=last",
            "trailing= in calibration spec '16,1,1,trailing=last' must be basket, merge or weighted",
        ),
        ("16,1,1,trailing=merge,trailing=weighted", "gives trailing= twice"),
        ("16,1,1,self=0.5,self=1", "gives self= twice"),  # stored as self_share: checked by the spec's own name
        ("16,1,1,special=equal,special=original", "gives special= twice"),
        ("16,1,1,tail=merge", "unknown variant 'tail'.*trailing=POLICY"),
    ]:
        with pytest.raises(ValueError, match=match):
            Calibration.parse(spec)


@pytest.mark.parametrize("policy", ["merge", "weighted"])
def test_saved_model_round_trips_the_policy_and_loads_it_flag_free(tiny_model_path, tmp_path, policy):
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling)
    texts = _texts(8)
    cal = Calibration(basket_size=8, layers=0.5, strength=1.0, trailing=policy)
    want = model.encode(texts, calibration=cal)
    assert (
        np.abs(want - model.encode(texts, calibration=Calibration(basket_size=8, layers=0.5, strength=1.0))).max()
        > 1e-4
    )
    model.set_calibration(cal).save(str(tmp_path / "saved"))
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["posfair_calibration"]["trailing"] == policy
    again = posfair.load_model(str(tmp_path / "saved"))
    assert again.calibration == cal
    np.testing.assert_allclose(again.encode(texts), want, atol=1e-6)
    # plain sentence-transformers after `import posfair`: the calibration read from config.json
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "saved")).encode(texts), want, atol=1e-5)
