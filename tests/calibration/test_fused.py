"""The fused all-rows path (posfair.calibration.fused) against an independent float64 reference,
on padded batches (left and right), grouped-query attention, every isolation / share variant,
strength 0, bfloat16; when it applies; and that models reach it through both backends."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import posfair.calibration.fused as fused
from posfair import Calibration
from posfair.calibration.state import ForwardState
from reference import reference_calibrate_row


class Layer:
    layer_idx, is_causal = 0, False


def _case(B, H, Hkv, L, D, seed, left=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, H, D, generator=g).transpose(1, 2) * 2  # transformers' (B, L, H, D) -> (B, H, L, D) views
    k = torch.randn(B, Hkv, L, D, generator=g) * 2
    v = torch.randn(B, Hkv, L, D, generator=g)
    n = torch.randint(max(1, L // 3), L + 1, (B,), generator=g)
    n[0] = L
    start = (L - n) if left else torch.zeros(B, dtype=torch.long)
    end = start + n - 1
    return q.to(dtype), k.to(dtype), v.to(dtype), start, end


def _state(start, end, **cal):
    resolved = Calibration(layers=1.0, queries="all", **cal).resolve("mean", 1)
    return ForwardState(frozenset(), start, end, calibration=resolved, pooling="mean")


def _padding_mask(start, end, L):
    keys = torch.arange(L)
    return ((keys >= start[:, None]) & (keys <= end[:, None]))[:, None, None, :].expand(-1, 1, L, L)


def _reference(q, k, v, start, end, scaling, cal):
    """float64: full softmax over each sequence's valid keys, every valid row calibrated by the loop reference."""
    B, H, L, D = q.shape
    rep = H // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1).double(), v.repeat_interleave(rep, 1).double()
    out = torch.zeros(B, H, L, D, dtype=torch.float64)
    for b in range(B):
        s, e = int(start[b]), int(end[b])
        scores = q[b].double() @ kk[b].transpose(-1, -2) * scaling
        scores[..., :s] = -torch.inf
        scores[..., e + 1 :] = -torch.inf
        w = torch.softmax(scores, -1).numpy()
        for h, r in itertools.product(range(H), range(s, e + 1)):
            w[h, r] = reference_calibrate_row(
                w[h, r], s, e, cal["basket_size"], cal.get("strength", 0.5), cal.get("isolate_bos", False),
                cal.get("isolate_eos", False), cal.get("bos_weight", "original"), cal.get("eos_weight", "equal"),
                prior=cal["prior"]["values"][0] if "prior" in cal else None, trailing=cal.get("trailing", "basket"),
            )  # fmt: skip
        out[b] = torch.from_numpy(w) @ vv[b]
    return out.transpose(1, 2)  # (B, L, H, D)


def _valid_rows(start, end, L):
    rows = torch.arange(L)
    return (rows >= start[:, None]) & (rows <= end[:, None])  # (B, L): padding query rows are never pooled


VARIANTS = [
    dict(basket_size=5),
    dict(basket_size=4, strength=1.0),
    dict(basket_size=3, isolate_bos=True, bos_weight="original"),
    dict(basket_size=3, isolate_bos=True, bos_weight="equal", strength=0.8),
    dict(basket_size=4, isolate_eos=True, eos_weight="equal"),
    dict(basket_size=4, isolate_eos=True, eos_weight="original", strength=1.0),
    dict(basket_size=2, isolate_bos=True, isolate_eos=True, bos_weight=0.1, eos_weight=0.05),
    dict(basket_size=6, isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight="equal", strength=0.3),
    dict(basket_size=4, prior={"values": [[3.0, 1.0, 0.5, 2.0, 1.5]]}),  # the positional prior
    dict(
        basket_size=3, isolate_bos=True, isolate_eos=True, bos_weight=0.1, strength=0.9, prior={"values": [[0.2, 4.0]]}
    ),
    # the trailing-basket policies (29 keys, random spans: trailing baskets of every length)
    dict(basket_size=4, strength=1.0, trailing="merge"),
    dict(basket_size=5, strength=0.7, trailing="weighted"),
    dict(basket_size=3, isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight="equal", trailing="merge"),
    dict(basket_size=4, isolate_eos=True, eos_weight="equal", trailing="weighted"),
    dict(basket_size=4, prior={"values": [[3.0, 1.0, 0.5, 2.0, 1.5]]}, trailing="merge"),
    dict(basket_size=3, isolate_bos=True, bos_weight="equal", prior={"values": [[0.2, 4.0]]}, trailing="weighted"),
]


@pytest.mark.parametrize("left", [False, True], ids=["right-padding", "left-padding"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize(
    "cal",
    VARIANTS,
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items() if k != "prior") + ("-prior" if "prior" in c else ""),
)
def test_fused_matches_the_float64_reference(cal, heads, left):
    H, Hkv = heads
    q, k, v, start, end = _case(3, H, Hkv, 29, 8, seed=len(str(cal)), left=left)
    state = _state(start, end, **cal)
    assert fused.applicable(Layer, q, k, v, _padding_mask(start, end, 29), state, False, {}, 0.0)
    ref = _reference(q, k, v, start, end, 0.35, cal)
    valid = _valid_rows(start, end, 29)
    # one call for everything; several query tiles; (sequence, head) groups that straddle sequences
    for tile, group in ((None, None), (7, None), (None, 5), (11, 1)):
        out = fused.basket_attention(q, k, v, 0.35, state, tile_rows=tile, heads_per_call=group)
        assert out.shape == (3, 29, H, 8) and out.is_contiguous()
        torch.testing.assert_close(out[valid].double(), ref[valid], atol=1e-5, rtol=0)


def test_short_sequences_are_left_alone_and_single_token_spans_work():
    """A sequence with fewer content keys than a basket is stock attention (also with BOS and EOS on one token)."""
    q, k, v, _, _ = _case(3, 2, 2, 12, 4, seed=5)
    start, end = torch.tensor([0, 0, 5]), torch.tensor([11, 2, 5])
    cal = dict(basket_size=4, isolate_bos=True, isolate_eos=True, strength=1.0)
    out = fused.basket_attention(q, k, v, 0.5, _state(start, end, **cal))
    ref = _reference(q, k, v, start, end, 0.5, cal)
    valid = _valid_rows(start, end, 12)
    torch.testing.assert_close(out[valid].double(), ref[valid], atol=1e-5, rtol=0)
    stock = F.scaled_dot_product_attention(q, k, v, attn_mask=_padding_mask(start, end, 12), scale=0.5).transpose(1, 2)
    torch.testing.assert_close(out[1:][valid[1:]], stock[1:][valid[1:]], atol=1e-5, rtol=0)


def test_strength_zero_is_stock_sdpa():
    q, k, v, start, end = _case(4, 4, 2, 40, 8, seed=1)
    out = fused.basket_attention(q, k, v, 0.3, _state(start, end, basket_size=8, strength=0.0, isolate_bos=True))
    mask = _padding_mask(start, end, 40)
    stock = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
    )
    valid = _valid_rows(start, end, 40)
    torch.testing.assert_close(out[valid], stock.transpose(1, 2)[valid], atol=1e-5, rtol=0)


def test_bfloat16_stays_bfloat16_and_matches_float32():
    q, k, v, start, end = _case(2, 4, 4, 300, 16, seed=2)
    cal = dict(basket_size=32, strength=0.7)
    ref = fused.basket_attention(q, k, v, 0.25, _state(start, end, **cal))
    low = fused.basket_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.25, _state(start, end, **cal))
    assert low.dtype == torch.bfloat16
    valid = _valid_rows(start, end, 300)
    cos = F.cosine_similarity(low.float()[valid].flatten(1), ref[valid].flatten(1), dim=-1)
    assert float(cos.min()) >= 0.999, float(cos.min())


def test_applies_only_where_it_is_exact():
    q, k, v, start, end = _case(2, 2, 2, 16, 4, seed=4)
    st = _state(start, end, basket_size=4)
    mask = _padding_mask(start, end, 16)
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    assert fused.applicable(Layer, q, k, v, mask, st, False, {}, 0.0)
    assert fused.applicable(Layer, q, k, v, additive, st, False, {}, 0.0)
    assert fused.applicable(Layer, q, k, v, mask[:, :, :1], st, False, {}, 0.0)  # (B, 1, 1, K)
    full = _state(torch.zeros(2, dtype=torch.long), torch.full((2,), 15), basket_size=4)
    assert fused.applicable(Layer, q, k, v, None, full, False, {}, 0.0)
    assert not fused.applicable(Layer, q, k, v, None, st, False, {}, 0.0)  # no mask but padded spans
    assert not fused.applicable(Layer, q, k, v, mask, st, True, {}, 0.0)  # recording
    assert not fused.applicable(Layer, q, k, v, mask, st, False, {}, 0.1)  # dropout
    assert not fused.applicable(Layer, q, k, v, mask, st, False, {"is_causal": True}, 0.0)
    window = mask & torch.ones(16, 16, dtype=torch.bool).triu(-3)  # a sliding window is more than padding
    assert not fused.applicable(Layer, q, k, v, window, st, False, {}, 0.0)
    bias = additive + torch.randn(16, 16)  # an additive bias is more than padding
    assert not fused.applicable(Layer, q, k, v, bias, st, False, {}, 0.0)
    assert not fused.applicable(Layer, q.double(), k.double(), v.double(), mask, st, False, {}, 0.0)
    assert fused.applicable(
        Layer, q, k, v, mask, _state(start, end, basket_size=4, prior={"values": [[1.0, 2.0]]}), False, {}, 0.0
    )
    assert not fused.applicable(Layer, q, k, v, mask, _state(start, end, basket_size=4, self_share=0.5), False, {}, 0.0)
    qg = q.clone().requires_grad_()
    assert not fused.applicable(Layer, qg, k, v, mask, st, False, {}, 0.0)  # training: the differentiable path
    with torch.no_grad():
        assert fused.applicable(Layer, qg, k, v, mask, st, False, {}, 0.0)


@pytest.fixture
def count_fused(monkeypatch):
    calls = []
    inner = fused.basket_attention
    monkeypatch.setattr(fused, "basket_attention", lambda *a, **kw: calls.append(1) or inner(*a, **kw))
    return calls


def test_mean_pooled_model_takes_the_fused_path(tiny_model, count_fused):
    """bert-mean (registry on 5.x, fallback's intercepted SDPA on 4.x) with a padded batch;
    the numbers are checked against the reference in test_engine / test_remote_code."""
    model = tiny_model("bert-mean")
    texts = ["alpha beta gamma " * 20, "delta epsilon", "zeta eta theta iota " * 9]
    with torch.no_grad(), model.using(Calibration(basket_size=8, layers=0.5, strength=0.7)):
        model(model.tokenize(texts))
    assert len(count_fused) == model.transformer_module.num_layers // 2


def test_remote_code_sdpa_reaches_the_fused_path(remote_model, count_fused):
    from remote_code_models import KINDS

    kind = next(k for k in KINDS if "sdpa" in k)
    model = remote_model(kind, "mean")
    with torch.no_grad(), model.using(Calibration(basket_size=4, layers=0.5, strength=0.7)):
        model(model.tokenize(["alpha beta gamma " * 10, "delta epsilon zeta"]))
    assert len(count_fused) >= 1


def test_embeddings_unchanged_by_switching_the_fused_path_off(tiny_model, monkeypatch):
    model = tiny_model("bert-mean")
    texts = ["alpha beta gamma " * 20, "delta epsilon", "zeta eta theta iota " * 9]
    cal = Calibration(basket_size=8, layers=0.5, strength=0.7, isolate_bos=True, isolate_eos=True)
    with torch.no_grad(), model.using(cal):
        fast = model(model.tokenize(texts))["sentence_embedding"]
        monkeypatch.setattr(fused, "ENABLED", False)
        tiled = model(model.tokenize(texts))["sentence_embedding"]
    np.testing.assert_allclose(fast.numpy(), tiled.numpy(), atol=1e-5, rtol=0)


def test_flash_calls_stay_within_the_output_budget():
    """Whole sequences grouped by head while the group fits FUSED_GROUP_BYTES; else one head in tiles of
    >= MIN_TILE_ROWS rows within FUSED_TILE_BYTES."""
    budget, row = fused.FUSED_TILE_BYTES, 64 * 32 * 4  # 64 baskets of a 32-wide head
    rows, group = fused._blocks(12, 8192, row, None, None)
    assert group == 1 and fused.MIN_TILE_ROWS <= rows < 8192 and rows * row <= max(budget, fused.MIN_TILE_ROWS * row)
    grouped = fused.FUSED_GROUP_BYTES
    rows, group = fused._blocks(12, 2048, 16 * 32 * 4, None, None)
    assert rows == 2048 and group * rows * 16 * 32 * 4 <= grouped and (group + 1) * rows * 16 * 32 * 4 > grouped
    assert group == 1  # issue 50: two pairs per call (8 MB of outputs) made the every-row path's sum 3x slower
    assert fused._blocks(384, 512, 4 * 32 * 4, None, None) == (512, grouped // (512 * 4 * 32 * 4))
    assert fused._blocks(3, 100, 8, None, None) == (100, 3)  # never more heads than there are
    assert fused._blocks(3, 100, 8, 7, 2) == (7, 2)  # explicit sizes are kept


def test_masses_are_the_softmax_over_baskets_and_isolated_keys():
    """fused._masses (issue 50, item 8: five passes, in place) is the softmax over the baskets' log-sum-exps and the
    isolated keys' scores: an absent key (-inf) and a fully masked basket (finfo.min) get 0, large scores stay finite."""
    g = torch.Generator().manual_seed(3)
    lse = torch.randn(2, 7, 5, generator=g) * 30
    lse[0, :, 4] = torch.finfo(torch.float32).min  # a basket past the content: every slot masked
    bos = torch.randn(2, 7, generator=g) * 30
    eos = torch.where(torch.arange(7) % 2 == 0, torch.randn(2, 7, generator=g) * 30, -torch.inf)
    want = torch.softmax(torch.cat([lse, bos[..., None], eos[..., None]], -1).double(), -1)
    mass, (b, e) = fused._masses(lse.clone(), [bos.clone(), eos.clone()])
    torch.testing.assert_close(torch.cat([mass, b[..., None], e[..., None]], -1).double(), want, atol=1e-6, rtol=0)
    assert bool((mass[0, :, 4] == 0).all()) and bool((e[:, 1::2] == 0).all())
    alone, none = fused._masses(lse.clone(), [])
    torch.testing.assert_close(alone.double(), torch.softmax(lse.double(), -1), atol=1e-6, rtol=0)
    assert none == []


def test_per_layer_prior_takes_the_fused_path_and_matches_the_tiled_one(tiny_model, count_fused, monkeypatch):
    """A positional prior with a different density in each calibrated layer: fused == tiled explicit path."""
    from posfair.calibration.params import PositionalPrior

    model = tiny_model("bert-mean")
    texts = ["alpha beta gamma " * 20, "delta epsilon", "zeta eta theta iota " * 9]
    layers = model.transformer_module.resolve(Calibration(layers=0.5)).layers
    prior = PositionalPrior(values=tuple((4.0 - i, 1.0, 0.3 + i) for i in range(len(layers))), layers=layers)
    cal = Calibration(basket_size=8, layers=0.5, strength=0.9, isolate_bos=True, prior=prior)
    with torch.no_grad(), model.using(cal):
        fast = model(model.tokenize(texts))["sentence_embedding"]
        assert len(count_fused) == len(layers)
        monkeypatch.setattr(fused, "ENABLED", False)
        tiled = model(model.tokenize(texts))["sentence_embedding"]
        with model.using(Calibration(basket_size=8, layers=0.5, strength=0.9, isolate_bos=True)):
            uniform = model(model.tokenize(texts))["sentence_embedding"]
    np.testing.assert_allclose(fast.numpy(), tiled.numpy(), atol=1e-5, rtol=0)
    assert float((fast - uniform).abs().max()) > 1e-4  # the prior changed the embeddings
