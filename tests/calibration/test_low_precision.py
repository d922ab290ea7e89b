"""A bfloat16 model calibrates in bfloat16: embeddings agree with the float32 model's calibrated ones
(cosine >= 0.999), on every path (the fused all-rows kernel for mean pooling, the explicit pooling
row for CLS and for last-token pooling with grouped-query attention), and the pooling row's keys
are upcast a block at a time without changing a number."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import posfair.calibration.fused as fused
import posfair.calibration.kernels as kernels
from posfair import Calibration

TEXTS = [
    "river stone light market " * 30,
    "policy court season engine signal harbour " * 12,
    "alpha beta gamma delta " * 9,
    "short text",
]
CAL = Calibration(basket_size=8, layers=0.5, strength=1.0)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _peaked(model):
    """A copy whose query projections are scaled up: a tiny random model's attention is nearly
    uniform, which calibration would leave almost unchanged (nothing to measure)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("query.weight", "q_proj.weight")):
                param.mul_(8.0)
    return model


@pytest.mark.parametrize("arch", ["bert-mean", "bert", "qwen3"])
def test_bfloat16_calibrated_embeddings_match_float32(tiny_model, arch, monkeypatch):
    model32 = _peaked(tiny_model(arch))
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    calls = []
    if arch == "bert-mean":  # the fused kernel must be what runs, in bfloat16
        real = fused.basket_attention

        def spy(query, *args, **kwargs):
            calls.append(query.dtype)
            return real(query, *args, **kwargs)

        monkeypatch.setattr(fused, "basket_attention", spy)
    kw = dict(batch_size=len(TEXTS), convert_to_numpy=True)
    stock32 = model32.encode(TEXTS, **kw)
    cal32 = model32.encode(TEXTS, calibration=CAL, **kw)
    calls.clear()
    cal16 = np.asarray(model16.encode(TEXTS, calibration=CAL, **kw), dtype=np.float64)
    if arch == "bert-mean":
        assert calls and set(calls) == {torch.bfloat16}
    agree = _cosines(cal16, cal32)
    assert agree.min() >= 0.999, agree
    assert not np.allclose(cal32, stock32, atol=1e-4)  # calibration ran


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_bfloat16_follows_calibration_on_the_real_model(pooling):
    """The bundled MiniLM, whose attention calibration really moves: the bfloat16 calibrated embedding
    is within 0.001 cosine of the float32 calibrated one, closer to it than to the stock one, and
    calibrating adds no rounding beyond the model's own in bfloat16 (stock bf16 vs stock fp32)."""
    import posfair

    model32 = posfair.load_model(pooling=pooling)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    cal = Calibration(basket_size=16, layers=0.5, strength=1.0)
    kw = dict(batch_size=len(TEXTS), convert_to_numpy=True)
    stock32 = model32.encode(TEXTS[:3], **kw)
    stock16 = np.asarray(model16.encode(TEXTS[:3], **kw), dtype=np.float64)
    cal32 = model32.encode(TEXTS[:3], calibration=cal, **kw)
    cal16 = np.asarray(model16.encode(TEXTS[:3], calibration=cal, **kw), dtype=np.float64)
    agree = _cosines(cal16, cal32)
    assert agree.min() >= 0.999, agree
    moved = np.linalg.norm(cal32 - stock32, axis=1)
    err = np.linalg.norm(cal16 - cal32, axis=1)
    rounding = np.linalg.norm(stock16 - stock32, axis=1)
    assert (err < 0.5 * moved).all(), (err, moved)
    assert (err < 2 * rounding).all(), (err, rounding)


def test_pooling_row_keys_are_upcast_in_blocks(tiny_model, monkeypatch):
    model = copy.deepcopy(tiny_model("bert")).to(torch.bfloat16)
    whole = model.encode(TEXTS, calibration=CAL, batch_size=len(TEXTS), convert_to_numpy=False)

    monkeypatch.setattr(kernels, "KEY_BLOCK_BYTES", 16 * 64 * 4)  # 16 keys of 4 heads x 16 dims per block
    blocks = model.encode(TEXTS, calibration=CAL, batch_size=len(TEXTS), convert_to_numpy=False)
    torch.testing.assert_close(torch.stack(blocks), torch.stack(whole), rtol=0, atol=0)
