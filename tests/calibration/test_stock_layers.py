"""Stock layers shared between the stock pass and calibrated passes (``posfair.model.stock_layers``): the same
numbers, bit for bit, as encoding without sharing, on every tiny architecture and attention path; the
lower layers really are skipped; a batch that cannot be shared is computed in full and counted."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from remote_code_models import KINDS, attention_modules
from tiny_models import ARCHS

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
TEXTS = [" ".join(np.random.default_rng(i).choice(WORDS, 12 + 9 * i)) for i in range(7)]  # mixed lengths
HALF = Calibration(basket_size=8, layers=0.5, strength=0.75)  # layers 2, 3 of 4
TOP = Calibration(basket_size=4, layers=0.25, strength=1.0)  # layer 3
BATCH = 3  # 7 texts: 3 batches per pass


def _models(tiny_model, remote_model):
    yield from ((arch, tiny_model(arch)) for arch in ARCHS)
    yield from ((f"remote-{kind}", remote_model(kind, "mean")) for kind in KINDS)


def _layer_calls(model):
    """Counts calls of layer 0's attention module (a forward hook; the skipped layers never call it)."""
    stack = model.transformer_module.layer_stack()
    att = next(m for m in stack[0].modules() if m is not stack[0] and "attention" in type(m).__name__.lower())
    calls = [0]
    handle = att.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def test_shared_stock_layers_give_the_same_bits_on_every_architecture(tiny_model, remote_model):
    for name, model in _models(tiny_model, remote_model):
        full = {c: model.encode(TEXTS, calibration=c, batch_size=BATCH) for c in (STOCK, HALF, TOP)}
        assert np.abs(full[HALF] - full[STOCK]).max() > 1e-4, name  # the calibrations change the embeddings
        calls, handle = _layer_calls(model)
        try:
            with model.sharing_stock_layers([HALF, TOP]) as share:
                assert share is not None and share.starts == (2, 3), name
                got = {STOCK: model.encode(TEXTS, calibration=STOCK, batch_size=BATCH)}
                stock_calls = calls[0]
                got[HALF] = model.encode(TEXTS, calibration=HALF, batch_size=BATCH)
                got[TOP] = model.encode(TEXTS, calibration=TOP, batch_size=BATCH)
        finally:
            handle.remove()
        for c, vectors in got.items():
            np.testing.assert_array_equal(
                vectors, full[c], err_msg=f"{name} {c.label() if c is not STOCK else 'stock'}"
            )
        assert stock_calls == 3 and calls[0] == stock_calls, (name, stock_calls, calls[0])  # layer 0 ran for stock only
        # 3 batches x 2 kept outputs (below layers 2 and 3); HALF starts at 2, TOP at 3
        assert (share.outputs_kept, share.batches_shared, share.batches_not_found) == (6, 6, 0), (name, share.summary())
        assert share.layers_skipped == 3 * 2 + 3 * 3
        assert not share.kept  # released when the block ends


def test_what_cannot_be_shared_is_computed_in_full_and_counted(tiny_model):
    model = tiny_model("bert-mean")
    low = Calibration(basket_size=8, layers=1.0, strength=0.5)  # every layer: nothing below it is stock
    full = {c: model.encode(TEXTS, calibration=c, batch_size=BATCH) for c in (HALF, TOP, low)}
    by_two = model.encode(TEXTS, calibration=TOP, batch_size=2)  # other batches: other padding, other last bits
    with model.sharing_stock_layers([low]) as share:
        assert share is None  # the first calibrated layer is 0: nothing to share
    with model.sharing_stock_layers([low, TOP]) as share:  # K = 3 only
        assert share.starts == (3,)
        model.encode(TEXTS, calibration=STOCK, batch_size=BATCH)
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=low, batch_size=BATCH), full[low])  # from 0
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=HALF, batch_size=BATCH), full[HALF])  # 2 < K
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=TOP, batch_size=2), by_two)  # not kept
        # low's and HALF's 3 batches start below K; of TOP's batches of 2, 2, 2, 1 only the single text was kept
        assert (share.batches_shared, share.batches_not_found) == (1, 3 + 3 + 3)
    with model.sharing_stock_layers([TOP], budget_bytes=0) as share:
        model.encode(TEXTS, calibration=STOCK, batch_size=BATCH)
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=TOP, batch_size=BATCH), full[TOP])
        assert (share.outputs_kept, share.outputs_over_budget, share.batches_not_found) == (0, 3, 3)


def test_another_thread_and_a_copy_are_not_part_of_the_block(tiny_model):
    model = tiny_model("bert")
    full = model.encode(TEXTS, calibration=HALF, batch_size=BATCH)
    with model.sharing_stock_layers([HALF]) as share:
        model.encode(TEXTS, calibration=STOCK, batch_size=BATCH)
        out = {}
        thread = threading.Thread(
            target=lambda: out.setdefault("v", model.encode(TEXTS, calibration=HALF, batch_size=BATCH))
        )
        thread.start()
        thread.join()
        np.testing.assert_array_equal(out["v"], full)
        assert (share.batches_shared, share.batches_not_found) == (0, 0)  # the thread's passes took no part
        twin = copy.deepcopy(model)  # its own layers and wrappers: not the block's model
        np.testing.assert_array_equal(twin.encode(TEXTS, calibration=HALF, batch_size=BATCH), full)
        assert (share.batches_shared, share.batches_not_found) == (0, 0)
        stack = twin.transformer_module.layer_stack()
        assert all(layer.forward.layer is layer and layer.forward.stack is stack for layer in stack)


@pytest.mark.parametrize("kind", ["functional", "sdpa"])
def test_remote_code_layers_are_found(remote_model, kind):
    model = remote_model(kind, "cls")
    stack = model.transformer_module.layer_stack()
    assert [layer.attention for layer in stack] == attention_modules(model)


def test_a_models_first_forward_pass_may_be_inside_the_block(remote_model_path):
    """A fallback model probes its attention with a forward pass of its own on first use: inside a
    sharing block that probe is not the batch's pass (nothing kept from it, nothing skipped in it)."""
    import posfair

    fresh = [posfair.load_model(remote_model_path("sdpa"), trust_remote_code=True, pooling="mean") for _ in range(2)]
    full = {c: fresh[0].encode(TEXTS, calibration=c, batch_size=BATCH) for c in (STOCK, HALF)}
    model = fresh[1]
    from posfair.model.calibrated_transformer import Route

    assert model.transformer_module.route in (Route.UNPROBED, Route.FALLBACK)  # not probed yet (FALLBACK_CHECKED once)
    with model.sharing_stock_layers([HALF]) as share:
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=STOCK, batch_size=BATCH), full[STOCK])
        np.testing.assert_array_equal(model.encode(TEXTS, calibration=HALF, batch_size=BATCH), full[HALF])
    assert (share.outputs_kept, share.batches_shared) == (3, 3)
