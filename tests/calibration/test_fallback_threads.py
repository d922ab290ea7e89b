"""The fallback backend touches only the calibrated forward's own thread.

A calibrated forward is made to block inside a calibrated layer's attention module
(while its interception is active); meanwhile the main thread calls every softmax
spelling and SDPA on attention-shaped tensors of its own, encodes the same model stock
and calibrated differently, and must get exactly what it gets when nothing else runs.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode

from posfair import Calibration
from posfair.calibration import STOCK
from remote_code_models import attention_modules

TEXTS = ["one two three four five six seven eight nine ten eleven twelve " * 4, "a b c d e f g h i j k l m n o p"]
CAL = Calibration(basket_size=8, layers=0.5, strength=0.5)
OTHER = Calibration(basket_size=4, layers=1.0, strength=0.9)


def own_work(B: int, H: int, L: int, D: int) -> dict[str, torch.Tensor]:
    """Softmax / SDPA calls on tensors shaped exactly like the blocked forward's attention."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, H, L, L, generator=g)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    bias = torch.where(torch.rand(B, 1, 1, L, generator=g) < 0.2, torch.finfo(torch.float32).min, 0.0)
    return {
        "F.softmax": F.softmax(x, dim=-1),
        "torch.softmax": torch.softmax(x, -1),
        "Tensor.softmax": x.softmax(dim=-1),
        "nn.Softmax": nn.Softmax(dim=-1)(x),
        "torch.special.softmax": torch.special.softmax(x, -1),
        "sdpa": F.scaled_dot_product_attention(q, k, v),
        "sdpa+mask": F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
    }


@pytest.mark.parametrize("kind", ["functional", "sdpa"])
def test_other_threads_are_untouched_during_a_calibrated_forward(remote_model, kind):
    model = remote_model(kind, "cls")
    features = model.tokenize(TEXTS)
    B, L = features["input_ids"].shape
    mods = attention_modules(model)
    H, D = mods[0].heads, mods[0].head_dim
    # what everything gives when nothing else runs
    alone_work = own_work(B, H, L, D)
    alone_stock = model.encode(TEXTS, calibration=STOCK, batch_size=8)
    alone_cal = model.encode(TEXTS, calibration=CAL, batch_size=8)
    alone_other = model.encode(TEXTS, calibration=OTHER, batch_size=8)

    inside, release = threading.Event(), threading.Event()
    result: dict = {}

    def block(module, query):
        if threading.current_thread() is worker:
            inside.set()
            assert release.wait(60), "the test never released the calibrated forward"

    def calibrated():
        try:
            result["cal"] = model.encode(TEXTS, calibration=CAL, batch_size=8)
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc

    target = mods[-1]  # a calibrated layer (layers=0.5 -> 2 and 3)
    target.before_attention = block
    worker = threading.Thread(target=calibrated, daemon=True)
    try:
        worker.start()
        assert inside.wait(60), "the calibrated forward never reached the attention"
        assert worker.is_alive()
        concurrent_work = own_work(B, H, L, D)
        concurrent_stock = model.encode(TEXTS, calibration=STOCK, batch_size=8)
        concurrent_other = model.encode(TEXTS, calibration=OTHER, batch_size=8)
        assert worker.is_alive() and not release.is_set()  # all of it ran while the calibrated forward was inside
    finally:
        release.set()
        worker.join(60)
        target.before_attention = None
    assert not worker.is_alive()
    if "error" in result:
        raise result["error"]
    for name, want in alone_work.items():
        assert torch.equal(concurrent_work[name], want), name
    np.testing.assert_array_equal(concurrent_stock, alone_stock)
    np.testing.assert_array_equal(concurrent_other, alone_other)
    np.testing.assert_array_equal(result["cal"], alone_cal)
    assert np.abs(alone_cal - alone_stock).max() > 1e-3


def test_no_torch_global_is_patched_during_a_calibrated_forward(remote_model):
    model = remote_model("functional", "cls")
    seen = {}
    names = ("softmax", "scaled_dot_product_attention")
    before = {n: getattr(F, n) for n in names} | {
        "torch.softmax": torch.softmax,
        "Tensor.softmax": torch.Tensor.softmax,
    }

    def look(module, query):
        seen.update(
            {n: getattr(F, n) for n in names} | {"torch.softmax": torch.softmax, "Tensor.softmax": torch.Tensor.softmax}
        )

    mods = attention_modules(model)
    mods[-1].before_attention = look
    try:
        model.encode(TEXTS, calibration=CAL)
    finally:
        mods[-1].before_attention = None
    assert seen and all(seen[n] is before[n] for n in before)


def test_an_exception_inside_the_attention_leaves_no_interception_behind(remote_model):
    model = remote_model("functional", "cls")
    want = model.encode(TEXTS, calibration=CAL)
    x = torch.randn(3, 4, 9, 9)
    stock_softmax = torch.softmax(x, -1)

    def boom(module, query):
        raise RuntimeError("boom")

    mods = attention_modules(model)
    mods[-1].before_attention = boom
    try:
        with pytest.raises(RuntimeError, match="boom"):
            model.encode(TEXTS, calibration=CAL)
    finally:
        mods[-1].before_attention = None
    assert _get_current_function_mode() is None  # the forward hook (always_call) left the layer's mode
    assert torch.equal(torch.softmax(x, -1), stock_softmax)
    np.testing.assert_array_equal(model.encode(TEXTS, calibration=CAL), want)
