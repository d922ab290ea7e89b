"""A model with a default calibration can be fine-tuned: the calibrated forward pass is differentiable
(its gradient is the true one, checked against finite differences) on every path, and attention dropout
reaches the calibrated layers in training mode as it reaches stock ones.

Covers the registry path (transformers 5.x) and the fallback (BERT on transformers 4.x), for CLS
pooling (the pooling row recomputed) and mean pooling (every row calibrated in place, in tiles).
"""

from __future__ import annotations

import pytest
import torch

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.model import compat
from tiny_models import build_tiny_model

TEXTS = [
    "the apt package manager installs and upgrades software packages from configured repositories on the machine",
    "kernel modules are loaded at boot and provide drivers for the hardware",
]


def _features(model):
    return compat.preprocess(model, TEXTS, None)


def _embeddings(model) -> torch.Tensor:
    return model(_features(model))["sentence_embedding"]


def _loss_and_grads(model, direction: torch.Tensor):
    model.zero_grad()
    loss = (_embeddings(model) * direction).sum()
    loss.backward()
    # parameters the embedding does not use (BERT's pooler) get no gradient: zero
    return loss.item(), [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


@torch.no_grad()
def _shift(model, vectors: list[torch.Tensor], eps: float) -> None:
    for p, v in zip(model.parameters(), vectors, strict=True):
        p.add_(eps * v)


@pytest.mark.parametrize("arch", ["bert-mean", "bert"])
def test_calibrated_gradients_are_the_true_gradients(tiny_model_path, arch):
    path, pooling = tiny_model_path(arch)
    cal = Calibration(basket_size=4, layers=0.5, strength=1.0)
    model = posfair.load_model(path, pooling=pooling, device="cpu", calibration=cal)
    model.eval()  # no dropout: the forward pass is a deterministic function of the weights
    assert model.calibration_coverage(TEXTS).calibrated == len(TEXTS)
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(len(TEXTS), model.get_embedding_dimension(), generator=gen)
    _, grads = _loss_and_grads(model, direction)
    assert all(torch.isfinite(g).all() for g in grads)
    with model.using(STOCK):
        _, stock_grads = _loss_and_grads(model, direction)
    assert any(not torch.allclose(g, s, atol=1e-7) for g, s in zip(grads, stock_grads, strict=True))

    # directional derivative along a random weight direction vs a central finite difference
    vectors = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
    analytic = sum(float((g * v).sum()) for g, v in zip(grads, vectors, strict=True))
    eps = 1e-3
    with torch.no_grad():
        _shift(model, vectors, eps)
        up = float((_embeddings(model) * direction).sum())
        _shift(model, vectors, -2 * eps)
        down = float((_embeddings(model) * direction).sum())
        _shift(model, vectors, eps)
    numeric = (up - down) / (2 * eps)
    assert analytic == pytest.approx(numeric, rel=2e-2, abs=1e-3)


def test_attention_dropout_reaches_calibrated_layers(tmp_path):
    # every layer calibrated, mean pooling: every attention row is computed by posfair, so any
    # randomness in training mode comes from the attention dropout posfair applies (hidden dropout is 0)
    path, pooling = build_tiny_model(
        "bert-mean", tmp_path / "m", attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0
    )
    model = posfair.load_model(
        path, pooling=pooling, device="cpu", calibration=Calibration(basket_size=4, layers=1.0, strength=1.0)
    )
    with torch.no_grad():
        model.eval()
        evaluated = _embeddings(model)
        model.train()
        torch.manual_seed(1)
        first = _embeddings(model)
        torch.manual_seed(1)
        repeated = _embeddings(model)
        torch.manual_seed(2)
        other = _embeddings(model)
    assert torch.equal(first, repeated)  # the dropout masks are the only randomness
    assert not torch.allclose(first, evaluated, atol=1e-4) and not torch.allclose(first, other, atol=1e-4)
    model.train()
    loss = _embeddings(model).pow(2).sum()
    loss.backward()  # and it trains
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
