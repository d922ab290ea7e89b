"""The stock layers below the first calibrated layer, computed once for stock and every calibration.

A calibration changes attention only in its layers (``Calibration.layers``: for the default,
the last half), so below its first calibrated layer K a calibrated forward pass computes
exactly what the stock pass computes, operation by operation (the attention backends run
the stock kernel in every layer they do not calibrate).  A pipeline that encodes the same
texts stock and then with one or more calibrations -- the audit, the tuner, the demo -- can
therefore compute layers 0..K-1 once:

* within :class:`StockLayers` (``FairModel.sharing_stock_layers``), each *stock* forward pass
  keeps the output of layer K-1 of its batch for each first calibrated layer K of the block's
  calibrations, keyed by a digest of the batch's inputs (token ids, padding mask, every other
  input tensor); kept on the CPU;
* a *calibrated* forward pass on a batch with the same digest skips layers 0..K-1 for the
  highest kept K at or below its own first calibrated layer, and starts layer K from the kept
  output.

The result is bit-identical to the full calibrated pass (``tests/test_stock_layers.py``
compares them with ``assert_array_equal`` on every architecture and attention path).  A
batch that is not found (another batching, a cached stock pass, the memory budget spent) is
computed in full: sharing saves time, never changes a number.  The kept outputs live as long
as the ``with`` block; ``budget_bytes`` bounds them (beyond it nothing more is kept).

Each layer module of the model gets a small forward wrapper (:class:`_LayerForward`, a
module-level class, so the model still pickles and deep-copies); it acts only inside a
forward pass of its own model in the current thread / task (a ``ContextVar``), and is a
plain call otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "StockLayers",
    "BatchLayers",
    "active_batch",
    "active_sharing",
    "batch_part",
    "batch_scope",
    "sharing",
    "find_layer_stack",
    "install",
    "input_digest",
]

log = logging.getLogger(__name__)

#: the kept outputs' default memory bound (bytes)
DEFAULT_BUDGET = 2 * 1024**3


@dataclass
class StockLayers:
    """What one sharing block keeps and counts.  ``starts``: the first calibrated layers K (> 0) of the
    calibrations the block was opened for; a stock pass keeps the output of each layer K-1, a calibrated
    pass starts at the highest kept K at or below its own first calibrated layer."""

    starts: tuple[int, ...]
    stack_id: int  # id() of the model's layer stack: only that model's forward passes take part
    budget_bytes: int = DEFAULT_BUDGET
    kept: dict[tuple[bytes, int], Any] = field(default_factory=dict)  # (batch digest, K) -> layer K-1's output
    kept_bytes: int = 0
    outputs_kept: int = 0
    outputs_over_budget: int = 0
    batches_shared: int = 0  # calibrated batches that started above layer 0
    batches_not_found: int = 0  # calibrated batches computed in full (no kept stock output for them)
    layers_skipped: int = 0  # layer computations saved, over all shared batches

    def keep(self, key: bytes, start: int, output: Any) -> None:
        if (key, start) in self.kept:
            return
        size = _nbytes(output)
        if self.kept_bytes + size > self.budget_bytes:
            self.outputs_over_budget += 1
            return
        self.kept[key, start] = _copy(output, torch.device("cpu"))
        self.kept_bytes += size
        self.outputs_kept += 1

    def release(self) -> None:
        """Drop the kept outputs (the counts stay)."""
        self.kept.clear()

    def summary(self) -> str:
        return (
            f"stock layers shared below layer(s) {', '.join(map(str, self.starts))}: {self.batches_shared} calibrated "
            f"batch(es) started there ({self.layers_skipped} layer passes saved), {self.batches_not_found} computed "
            f"in full; {self.outputs_kept} stock layer output(s) kept ({self.kept_bytes / 1e6:.0f} MB), "
            f"{self.outputs_over_budget} over the {self.budget_bytes / 1e9:.1f} GB budget"
        )


@dataclass
class BatchLayers:
    """One forward pass's part in a sharing block."""

    stack_id: int  # id() of the layer stack (nn.ModuleList) of the model running
    below: int  # layers 0..below-1 take part (kept from, or skipped)
    shape: tuple[int, int]  # (batch, tokens) of the pass's inputs: a layer call on other hidden states is not its
    record: StockLayers | None = None  # a stock pass: keep the output of each layer K-1 (K in record.starts)
    key: bytes = b""
    replay: Any = None  # a calibrated pass with a kept output: layers 0..below-1 return (a copy of) it


_BATCH: contextvars.ContextVar[BatchLayers | None] = contextvars.ContextVar("posfair_stock_layers", default=None)
_SHARING: contextvars.ContextVar[StockLayers | None] = contextvars.ContextVar("posfair_sharing", default=None)


def active_sharing() -> StockLayers | None:
    """The sharing block open in this thread / task, if any."""
    return _SHARING.get()


@contextlib.contextmanager
def _set(var: contextvars.ContextVar, value: Any) -> Iterator[Any]:
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


@contextlib.contextmanager
def sharing(share: StockLayers | None, release: bool = True) -> Iterator[StockLayers | None]:
    """Within the block, forward passes of ``share``'s model take part (FairModel.sharing_stock_layers); with
    ``release`` the kept outputs go when it ends."""
    with _set(_SHARING, share):
        try:
            yield share
        finally:
            if share is not None and release:
                share.release()


def batch_part(share: StockLayers | None, stack_id: int, features: Mapping[str, Any], first_calibrated: int | None):
    """This forward pass's part in ``share`` (None: none): ``first_calibrated`` None = a stock pass (keep the
    outputs), else the first layer the pass calibrates (skip the layers below a kept output that matches)."""
    if share is None or share.stack_id != stack_id:
        return None
    ids = features.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    shape = (int(ids.shape[0]), int(ids.shape[1]))
    key = input_digest(features)
    if first_calibrated is None:
        return BatchLayers(stack_id, max(share.starts), shape, record=share, key=key)
    start = max((k for k in share.starts if k <= first_calibrated and (key, k) in share.kept), default=None)
    if start is None:
        share.batches_not_found += 1
        return None
    share.batches_shared += 1
    share.layers_skipped += start
    return BatchLayers(stack_id, start, shape, replay=share.kept[key, start])


def active_batch() -> BatchLayers | None:
    return _BATCH.get()


def batch_scope(batch: BatchLayers | None):
    """Within the block, ``batch`` is this forward pass's part (None: none)."""
    return _set(_BATCH, batch)


def input_digest(features: Mapping[str, Any]) -> bytes:
    """A digest of every tensor input of a forward pass (name, dtype, shape, values)."""
    h = hashlib.blake2b(digest_size=20)
    for name in sorted(features):
        value = features[name]
        if not isinstance(value, torch.Tensor):
            continue
        t = value.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes())
    return h.digest()


def find_layer_stack(model: nn.Module, num_layers: int) -> nn.ModuleList | None:
    """The model's stack of ``num_layers`` transformer layers (the ``nn.ModuleList`` of that length whose
    every element holds an attention submodule), or None."""
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) == num_layers:
            if all(
                any("attention" in type(s).__name__.lower() for s in layer.modules() if s is not layer) for layer in m
            ):
                return m
    return None


class _LayerForward:
    """A layer's forward inside sharing blocks: skip (return the kept output) or keep; a plain call otherwise."""

    def __init__(self, layer: nn.Module, index: int, stack: nn.ModuleList):
        self.layer, self.index, self.stack = layer, index, stack

    def __call__(self, *args, **kwargs):
        batch = _BATCH.get()
        plain = type(self.layer).forward
        if batch is None or batch.stack_id != id(self.stack) or self.index >= batch.below:
            return plain(self.layer, *args, **kwargs)
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, torch.Tensor) or tuple(hidden.shape[:2]) != batch.shape:
            return plain(self.layer, *args, **kwargs)  # another forward pass inside this one (a probe): not its part
        if batch.replay is not None:
            # layers below K-1 return the kept output as it is (the next skipped layer ignores it), K-1 a copy
            # on the device of the hidden states
            return _copy(batch.replay, hidden.device) if self.index == batch.below - 1 else batch.replay
        out = plain(self.layer, *args, **kwargs)
        if batch.record is not None and self.index + 1 in batch.record.starts:
            batch.record.keep(batch.key, self.index + 1, out)
        return out


def install(stack: nn.ModuleList) -> None:
    """Give every layer of ``stack`` its :class:`_LayerForward` (idempotent)."""
    for i, layer in enumerate(stack):
        current = layer.__dict__.get("forward")
        if isinstance(current, _LayerForward) and current.stack is stack and current.index == i:
            continue
        layer.forward = _LayerForward(layer, i, stack)


def _nbytes(output: Any) -> int:
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size()
    if isinstance(output, (tuple, list)):
        return sum(_nbytes(o) for o in output)
    return 0


def _copy(output: Any, device: torch.device) -> Any:
    """A detached copy of a layer's output on ``device`` (tensors, and tuples / lists of them)."""
    if isinstance(output, torch.Tensor):
        t = output.detach()
        return t.to(device, copy=True)
    if type(output) is tuple:
        return tuple(_copy(o, device) for o in output)
    if isinstance(output, list):
        return [_copy(o, device) for o in output]
    return output
