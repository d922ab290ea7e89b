"""The basket formula on hand-computed rows, and against a loop-based reference on random rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posfair.calibration.baskets import basket_weights, calibrate_rows, calibrate_span_
from posfair.calibration.params import BasketSettings
from reference import reference_calibrate_row

ROW = [0.4, 0.3, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0]  # keys 0..5 valid, 6..7 right padding


def ref(row, s, e, kw):
    """The loop reference with the fields of a BasketSettings."""
    return reference_calibrate_row(
        row, s, e, kw["basket_size"], kw.get("strength", 1.0), kw.get("isolate_bos", False),
        kw.get("isolate_eos", False), kw.get("bos_weight", "original"), kw.get("eos_weight", "equal"),
    )  # fmt: skip


def cal(row, s, e, **kw):
    return calibrate_rows(torch.tensor(row, dtype=torch.float64), s, e, BasketSettings(**kw)).numpy()


def test_no_isolation_equal_baskets_keep_proportions():
    out = cal(ROW, 0, 5, basket_size=2)
    # baskets {0,1} {2,3} {4,5}, each 1/3, proportions kept inside
    expected = [0.4 / 0.7 / 3, 0.3 / 0.7 / 3, 1 / 6, 1 / 6, 1 / 6, 1 / 6, 0, 0]
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_bos_equal_share_is_its_own_basket_and_last_basket_shorter():
    out = cal(ROW, 0, 5, basket_size=2, isolate_bos=True, bos_weight="equal")
    # BOS alone + content {1,2} {3,4} {5} (last basket shorter): n_total = 4
    expected = [0.25, 0.25 * 0.75, 0.25 * 0.25, 0.25 * 2 / 3, 0.25 / 3, 0.25, 0, 0]
    np.testing.assert_allclose(out, expected, atol=1e-12)
    assert out.sum() == pytest.approx(1.0)


def test_bos_original_share_left_alone_content_scaled_to_the_rest():
    out = cal(ROW, 0, 5, basket_size=2, isolate_bos=True, bos_weight="original")
    each = (1 - 0.4) / 3
    expected = [0.4, each * 0.75, each * 0.25, each * 2 / 3, each / 3, each, 0, 0]
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_float_share_for_eos_and_equal_for_bos():
    out = cal(ROW, 0, 5, basket_size=2, isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight=0.1)
    # content {1,2} {3,4}: n_b = 2, n_total = 4; BOS 1/4, EOS 0.1, each basket (1 - 0.35) / 2
    each = 0.65 / 2
    expected = [0.25, each * 0.75, each * 0.25, each * 2 / 3, each / 3, 0.1, 0, 0]
    np.testing.assert_allclose(out, expected, atol=1e-12)


def test_left_padding_span():
    row = [0.0, 0.0, 0.5, 0.2, 0.2, 0.1]  # keys 0..1 left padding, valid 2..5
    out = cal(row, 2, 5, basket_size=1, isolate_eos=True, eos_weight="equal")
    # content {2} {3} {4}, EOS 5 alone: n_total = 4, every key 1/4
    np.testing.assert_allclose(out, [0, 0, 0.25, 0.25, 0.25, 0.25], atol=1e-12)


def test_zero_mass_basket_stays_zero_then_renormalised():
    row = [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    out = cal(row, 0, 5, basket_size=2)
    # baskets {0,1} {2,3} {4,5}; the two empty ones stay 0, the row is renormalised
    np.testing.assert_allclose(out, [0.5, 0.5, 0, 0, 0, 0], atol=1e-12)
    row = [0.6, 0.2, 0.0, 0.0, 0.1, 0.1]
    out = cal(row, 0, 5, basket_size=2)
    np.testing.assert_allclose(out, [0.375, 0.125, 0, 0, 0.25, 0.25], atol=1e-12)


def test_strength_blends_linearly():
    full = cal(ROW, 0, 5, basket_size=2)
    half = cal(ROW, 0, 5, basket_size=2, strength=0.5)
    np.testing.assert_allclose(half, 0.5 * full + 0.5 * np.array(ROW), atol=1e-12)
    np.testing.assert_allclose(cal(ROW, 0, 5, basket_size=2, strength=0.0), ROW, atol=0)


def test_content_shorter_than_one_basket_is_unchanged():
    np.testing.assert_array_equal(cal(ROW, 0, 5, basket_size=6, isolate_bos=True), ROW)
    # exactly one full basket is calibrated (here: BOS equal share 1/2, content 1/2)
    out = cal(ROW, 0, 5, basket_size=5, isolate_bos=True, bos_weight="equal")
    np.testing.assert_allclose(out[0], 0.5)
    np.testing.assert_allclose(out[1:6].sum(), 0.5)


def test_padding_never_gets_mass_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 4, 10, 40, generator=g), -1)
    start = torch.tensor([0, 5, 0]).view(3, 1, 1)
    end = torch.tensor([39, 39, 20]).view(3, 1, 1)
    keys = torch.arange(40)
    valid = (keys >= start.unsqueeze(-1)) & (keys <= end.unsqueeze(-1))
    a = torch.where(valid, a, 0.0)
    a = a / a.sum(-1, keepdim=True)
    out = calibrate_rows(a, start, end, BasketSettings(basket_size=4, isolate_bos=True))
    assert torch.all(out[~valid.expand_as(out)] == 0)
    torch.testing.assert_close(out.sum(-1), torch.ones(3, 4, 10))


@pytest.mark.parametrize(
    "kw",
    [
        dict(basket_size=3),
        dict(basket_size=4, isolate_bos=True, bos_weight="original"),
        dict(basket_size=4, isolate_bos=True, bos_weight="equal"),
        dict(
            basket_size=5, isolate_bos=True, isolate_eos=True, bos_weight="original", eos_weight="equal", strength=0.5
        ),
        dict(basket_size=2, isolate_eos=True, eos_weight=0.3, strength=0.25),
        dict(basket_size=64),
    ],
)
def test_matches_loop_reference_on_random_rows(kw):
    rng = np.random.default_rng(1)
    for _ in range(30):
        K = int(rng.integers(2, 50))
        s = int(rng.integers(0, K))
        e = int(rng.integers(s, K))
        a = np.zeros(K)
        a[s : e + 1] = rng.dirichlet(np.ones(e - s + 1) * 0.5)
        if rng.random() < 0.3:  # a zero-mass stretch (never the whole row: that is no attention row)
            z = int(rng.integers(s, e + 1))
            b = a.copy()
            b[z : z + 3] = 0
            if b.sum() > 0:
                a = b / b.sum()
        got = cal(a, s, e, **kw)
        assert np.isfinite(got).all() and got.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(got, ref(a, s, e, kw), atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="basket_size"):
        cal(ROW, 0, 5, basket_size=0)
    with pytest.raises(ValueError, match="strength"):
        cal(ROW, 0, 5, basket_size=2, strength=1.5)


@pytest.mark.parametrize(
    "kw",
    [
        dict(basket_size=3),
        dict(basket_size=4, isolate_bos=True, bos_weight="original", strength=0.5),
        dict(basket_size=4, isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight=0.2),
        dict(basket_size=7, isolate_eos=True, eos_weight="original", strength=0.3),
        dict(basket_size=40),
    ],
)
def test_in_place_span_path_matches_reference(kw):
    rng = np.random.default_rng(2)
    for _ in range(10):
        K = int(rng.integers(2, 60))
        s = int(rng.integers(0, K))
        e = int(rng.integers(s, K))
        rows = np.zeros((5, K))
        rows[:, s : e + 1] = rng.dirichlet(np.ones(e - s + 1) * 0.5, size=5)
        if e - s + 1 > 9:  # a row with empty baskets (it keeps some mass)
            rows[1, s : s + 9] = 0
            rows[1] /= rows[1].sum()
        t = torch.tensor(rows)
        calibrate_span_(t, s, e, BasketSettings(**kw))
        for r in range(5):
            np.testing.assert_allclose(t[r].numpy(), ref(rows[r], s, e, kw), atol=1e-12)


# -- basket_weights: the formula on masses (the fused all-rows path, posfair.calibration.fused) ----------


def weights(mass, n_b, bos=None, eos=None, **kw):
    t = lambda x: None if x is None else torch.tensor(x, dtype=torch.float64)  # noqa: E731
    settings = BasketSettings(basket_size=1, **kw)  # the "basket" policy reads no basket size
    w, b, e = basket_weights(t(mass), n_b, t(bos), t(eos), settings)
    return w.numpy(), None if b is None else float(b), None if e is None else float(e)


def test_basket_weights_equal_baskets():
    w, b, e = weights([0.5, 0.3, 0.2], 3)
    np.testing.assert_allclose(w, [1 / 3] * 3, atol=1e-12)
    assert b is None and e is None


def test_basket_weights_strength_blends_with_the_original_masses():
    w, _, _ = weights([0.5, 0.3, 0.2], 3, strength=0.5)
    np.testing.assert_allclose(w, [0.5 / 3 + 0.25, 0.5 / 3 + 0.15, 0.5 / 3 + 0.1], atol=1e-12)


def test_basket_weights_bos_original_and_eos_equal():
    # content masses 0.3 0.1 (n_b = 2), BOS 0.4 kept, EOS 0.2 -> 1/4; each basket (1 - 0.65) / 2
    w, b, e = weights([0.3, 0.1], 2, bos=0.4, eos=0.2, bos_weight="original", eos_weight="equal")
    np.testing.assert_allclose(w, [0.175, 0.175], atol=1e-12)
    assert b == pytest.approx(0.4) and e == pytest.approx(0.25)


def test_basket_weights_zero_mass_basket_stays_zero_and_row_renormalised():
    # per = 1/3 each, the empty basket drops out: total 2/3 -> each nonzero basket 1/2
    w, _, _ = weights([0.6, 0.4, 0.0], 3)
    np.testing.assert_allclose(w, [0.5, 0.5, 0.0], atol=1e-12)


def test_basket_weights_unused_slots_beyond_the_row_baskets():
    # a batch laid out for 3 baskets, this row has 2: its third slot has mass 0
    w, _, e = weights([0.7, 0.2, 0.0], 2, eos=0.1, eos_weight=0.2)
    np.testing.assert_allclose(w, [0.4, 0.4, 0.0], atol=1e-12)
    assert e == pytest.approx(0.2)


@pytest.mark.parametrize("iso", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shares", [("original", "equal"), ("equal", "original"), (0.1, 0.05)])
@pytest.mark.parametrize("strength", [0.0, 0.3, 1.0])
def test_basket_weights_sum_calibrate_span(iso, shares, strength):
    """Summing calibrate_span_'s output over each basket gives basket_weights of the row's masses."""
    g = torch.Generator().manual_seed(3)
    K, B, s, e = 23, 4, 1, 21  # key 0 and 22 are padding
    a = torch.zeros(5, K, dtype=torch.float64)
    a[:, s : e + 1] = torch.softmax(torch.randn(5, e - s + 1, generator=g, dtype=torch.float64) * 3, -1)
    a[0, s + 3 : s + 9] = 0.0  # a row with empty baskets
    a[0] /= a[0].sum()
    settings = BasketSettings(
        basket_size=B,
        strength=strength,
        isolate_bos=iso[0],
        isolate_eos=iso[1],
        bos_weight=shares[0],
        eos_weight=shares[1],
    )
    out = calibrate_span_(a.clone(), s, e, settings)
    cs, ce = s + int(iso[0]), e - int(iso[1])
    n_b = -(-(ce - cs + 1) // B)
    content = torch.zeros(5, n_b * B, dtype=torch.float64)
    content[:, : ce - cs + 1] = a[:, cs : ce + 1]
    mass = content.view(5, n_b, B).sum(-1)
    w, bv, ev = basket_weights(mass, n_b, a[:, s] if iso[0] else None, a[:, e] if iso[1] else None, settings)
    got = torch.zeros(5, n_b * B, dtype=torch.float64)
    got[:, : ce - cs + 1] = out[:, cs : ce + 1]
    torch.testing.assert_close(got.view(5, n_b, B).sum(-1), w, atol=1e-12, rtol=0)
    if iso[0]:
        torch.testing.assert_close(out[:, s], bv, atol=1e-12, rtol=0)
    if iso[1]:
        torch.testing.assert_close(out[:, e], ev, atol=1e-12, rtol=0)
