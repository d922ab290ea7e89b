"""The CUDA every-row path (posfair.calibration.cuda_rows) run on CPU: its CUDA-only kernel calls sit behind
``cuda_every_row_available``, the one switch these tests turn on, so everything else -- the blocking, the
gathers, the masks, the combination by basket_weights, both kernels' contracts ("sdpa": CPU flash attention
here; "flex": eager FlexAttention) and the dispatch -- is checked against the float64 reference of
tests/reference.py, in float32 and (with the tolerance stated below) bfloat16 / float16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posfair.calibration.cuda_rows as cuda_rows
import posfair.calibration.fused as fused
from posfair import Calibration
from posfair.calibration.state import ForwardState
from reference import Reference, fast_and_reference

# Low precision: ||out - ref|| / ||ref|| over the valid rows, against the float64 reference.
LOW_PRECISION_TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}


class Layer:
    layer_idx, is_causal = 0, False


def _case(B, H, Hkv, L, D, seed, left=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, H, D, generator=g).transpose(1, 2) * 2  # (B, H, L, D) views, as transformers passes them
    k = torch.randn(B, Hkv, L, D, generator=g) * 2
    v = torch.randn(B, Hkv, L, D, generator=g)
    n = torch.randint(max(1, L // 3), L + 1, (B,), generator=g)
    n[0] = L
    start = (L - n) if left else torch.zeros(B, dtype=torch.long)
    return q, k, v, start, start + n - 1


def _resolved(**cal):
    return Calibration(layers=1.0, queries="all", **cal).resolve("mean", 1)


def _reference(q, k, v, start, end, scaling, resolved):
    """float64 attention over each sequence's span, every valid row calibrated by tests/reference.py (None: stock)."""
    ref = Reference()
    ref.cal, ref.start, ref.end = resolved, start.numpy(), end.numpy()
    rep = q.shape[1] // k.shape[1]
    scores = q.double() @ k.repeat_interleave(rep, 1).double().transpose(-1, -2) * scaling
    keys = torch.arange(q.shape[2])
    inside = (keys >= start[:, None]) & (keys <= end[:, None])
    weights = torch.softmax(scores.masked_fill(~inside[:, None, None, :], -torch.inf), -1)
    w = weights.numpy().copy() if resolved is None else ref.calibrate_weights(weights.numpy().copy(), 0)
    return (torch.from_numpy(w) @ v.repeat_interleave(rep, 1).double()).transpose(1, 2)  # (B, L, H, D)


def _valid(start, end, L):
    rows = torch.arange(L)
    return (rows >= start[:, None]) & (rows <= end[:, None])  # padding query rows are never pooled


VARIANTS = [
    dict(basket_size=5),
    dict(basket_size=3, isolate_bos=True, isolate_eos=True, bos_weight="equal", eos_weight=0.05, strength=0.8),
    dict(basket_size=4, isolate_eos=True, eos_weight="original", trailing="weighted"),
    dict(basket_size=4, prior={"values": [[3.0, 1.0, 0.5, 2.0, 1.5]]}, trailing="merge"),
]


# one call; tiles of rows; groups of pairs straddling sequences (some with masked slots, some without); a tiny budget
BLOCKINGS = ((None, None, None), (None, 7, None), (None, None, 5), (None, 11, 1), (4096, None, None))


def _check_against_reference(cal, heads, left, kernel, blockings):
    H, Hkv = heads
    q, k, v, start, end = _case(3, H, Hkv, 29, 8, seed=len(str(cal)) + H, left=left)
    resolved = _resolved(**cal)
    state = ForwardState(frozenset(), start, end, calibration=resolved, pooling="mean")
    ref = _reference(q, k, v, start, end, 0.35, resolved)
    valid = _valid(start, end, 29)
    for budget, rows, pairs in blockings:
        out = cuda_rows.basket_attention(
            q, k, v, 0.35, state, kernel=kernel, budget=budget, tile_rows=rows, pairs_per_call=pairs
        )
        assert out.shape == (3, 29, H, 8) and out.dtype == torch.float32 and out.is_contiguous()
        torch.testing.assert_close(out[valid].double(), ref[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("left", [False, True], ids=["right-padding", "left-padding"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("cal", VARIANTS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items() if k != "prior"))
def test_every_row_path_matches_the_float64_reference(cal, heads, left):
    _check_against_reference(cal, heads, left, "sdpa", BLOCKINGS)


@pytest.mark.parametrize(
    "cal, heads, left", [(VARIANTS[1], (4, 2), True), (VARIANTS[3], (6, 1), False)], ids=["gqa-left", "mqa-right"]
)
def test_flex_kernel_matches_the_float64_reference(cal, heads, left):
    """FlexAttention's per-basket outputs and log-sum-exps (eager here, compiled on CUDA), masked slots included."""
    _check_against_reference(cal, heads, left, "flex", BLOCKINGS[2:4])


@pytest.mark.parametrize("kernel", cuda_rows.KERNELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_within_the_stated_tolerance(dtype, kernel):
    q, k, v, start, end = _case(2, 4, 2, 160, 16, seed=2)
    resolved = _resolved(basket_size=32, strength=0.7, isolate_bos=True)
    state = ForwardState(frozenset(), start, end, calibration=resolved, pooling="mean")
    out = cuda_rows.basket_attention(q.to(dtype), k.to(dtype), v.to(dtype), 0.25, state, kernel=kernel)
    assert out.dtype == dtype
    valid = _valid(start, end, 160)
    ref = _reference(q, k, v, start, end, 0.25, resolved)[valid]
    err = float((out[valid].double() - ref).norm() / ref.norm())
    assert err <= LOW_PRECISION_TOLERANCE[dtype], err
    stock = _reference(q, k, v, start, end, 0.25, None)[valid]
    assert float((ref - stock).norm() / ref.norm()) > 10 * err  # calibration moved the output far more than rounding


def test_the_switch_is_cuda_only(monkeypatch):
    assert cuda_rows.cuda_every_row_available(torch.device("cuda"))
    assert cuda_rows.cuda_every_row_available("cuda:1")
    assert not cuda_rows.cuda_every_row_available(torch.device("cpu"))
    monkeypatch.setattr(cuda_rows, "ENABLED", False)
    assert not cuda_rows.cuda_every_row_available(torch.device("cuda"))
    monkeypatch.setattr(cuda_rows, "ENABLED", True)
    q, k, v, start, end = _case(2, 2, 2, 16, 4, seed=4)
    state = ForwardState(frozenset(), start, end, calibration=_resolved(basket_size=4), pooling="mean")
    keys = torch.arange(16)
    mask = ((keys >= start[:, None]) & (keys <= end[:, None]))[:, None, None, :]
    assert not cuda_rows.applicable(Layer, q, k, v, mask, state, False, {}, 0.0)  # CPU: the fused path's
    monkeypatch.setattr(cuda_rows, "cuda_every_row_available", lambda device: True)
    assert cuda_rows.applicable(Layer, q, k, v, mask, state, False, {}, 0.0)
    assert cuda_rows.applicable(Layer, q.half(), k.half(), v.half(), mask, state, False, {}, 0.0)
    assert not cuda_rows.applicable(Layer, q, k, v, mask, state, True, {}, 0.0)  # recording: the tiled path
    assert not cuda_rows.applicable(Layer, q, k, v, mask, state, False, {"is_causal": True}, 0.0)


@pytest.fixture
def cuda_path_on_cpu(monkeypatch):
    """The switch on for CPU and the fused CPU path off: attend() dispatches as it does on CUDA."""
    calls = []
    inner = cuda_rows.basket_attention
    monkeypatch.setattr(cuda_rows, "cuda_every_row_available", lambda device: True)
    monkeypatch.setattr(fused, "ENABLED", False)
    monkeypatch.setattr(cuda_rows, "basket_attention", lambda *a, **kw: calls.append(1) or inner(*a, **kw))
    return calls


@pytest.mark.parametrize("kernel", cuda_rows.KERNELS)
def test_dispatch_takes_the_cuda_path_and_matches_the_model_reference(
    tiny_model, cuda_path_on_cpu, kernel, monkeypatch
):
    """A mean-pooled model with a padded batch, every row calibrated: attend() picks this path in every calibrated
    layer, and the embeddings match tests/reference.py's float64 forward."""
    monkeypatch.setattr(cuda_rows, "KERNEL", kernel)
    model = tiny_model("bert-mean")
    texts = ["alpha beta gamma " * 20, "delta epsilon", "zeta eta theta iota " * 9]
    cal = Calibration(basket_size=8, layers=0.5, strength=0.9, isolate_bos=True, isolate_eos=True)
    fast, ref = fast_and_reference(model, texts, cal)
    assert len(cuda_path_on_cpu) == model.transformer_module.num_layers // 2
    np.testing.assert_allclose(fast.numpy(), ref.numpy(), atol=1e-5, rtol=0)


def test_cpu_dispatch_is_unchanged(tiny_model, monkeypatch):
    """On CPU the fused path still computes the layer, with the switch on or off."""
    calls = []
    inner = fused.basket_attention
    monkeypatch.setattr(fused, "basket_attention", lambda *a, **kw: calls.append(1) or inner(*a, **kw))
    monkeypatch.setattr(cuda_rows, "basket_attention", lambda *a, **kw: pytest.fail("the CUDA path ran on CPU"))
    model = tiny_model("bert-mean")
    with torch.no_grad(), model.using(Calibration(basket_size=8, layers=0.5)):
        model(model.tokenize(["alpha beta gamma " * 20, "delta epsilon"]))
    assert len(calls) == model.transformer_module.num_layers // 2


def test_blocks_follow_the_budget():
    """All rows of as many pairs as fit; else one pair in tiles of at least 128 rows; given sizes kept."""
    row = 64 * (128 * 2 + cuda_rows.TABLE_BYTES)  # 64 baskets of a 128-wide bfloat16 head
    rows, group = cuda_rows._blocks(16, 8192, row, 512 * 2**20, None, None)
    assert (rows, group) == (8192, 3) and 3 * 8192 * row <= 512 * 2**20 < 4 * 8192 * row
    rows, group = cuda_rows._blocks(16, 32768, 4 * row, 128 * 2**20, None, None)
    assert group == 1 and rows == (128 * 2**20) // (4 * row) and rows * 4 * row <= 128 * 2**20
    assert cuda_rows._blocks(16, 4096, row, 1000, None, None) == (128, 1)  # at least 128 rows
    assert cuda_rows._blocks(3, 100, 8, 10**9, None, None) == (100, 3)
    assert cuda_rows._blocks(3, 100, 8, 10**9, 7, 2) == (7, 2)
    q = torch.empty(1, 16, 32768, 128, dtype=torch.bfloat16)
    assert cuda_rows.block_bytes(q) == q.numel() * 2  # the layer's query size, within the bounds
    assert cuda_rows.block_bytes(q[:, :, :16]) == cuda_rows.MIN_BLOCK_BYTES
