"""The fallback backend: calibration for models whose attention bypasses transformers' registry.

Remote-code models (gte-multilingual-base's ``NewAttention``, jina-v3, ...) -- and, on
transformers 4.x, BERT, XLM-RoBERTa and ModernBERT, which pick their own attention
classes there (:mod:`posfair.model.compat`) -- compute attention inside their own modules: a softmax (``nn.functional.softmax``,
``torch.softmax``, ``Tensor.softmax``, an ``nn.Softmax`` module) or a
``scaled_dot_product_attention`` call.  posfair finds each layer's attention module
structurally (:func:`find_layer_attention_modules`) and :func:`install` gives it two
persistent hooks:

- a forward pre-hook that, when the current thread's :class:`ForwardState` wants the
  layer calibrated or recorded, enters a per-thread ``TorchFunctionMode``
  (:class:`LayerMode`); a forward hook (``always_call=True``, so an exception cannot
  leave it pushed) leaves it.  Torch-function modes live on a thread-local stack: a
  softmax or a forward of the same model in another thread is never touched, and no
  torch global is ever patched.
- The mode sees every softmax spelling and SDPA call of the module as one top-level
  call (it is disabled while it handles one, so ``F.softmax``'s internal
  ``Tensor.softmax`` is not seen again): each attention call is calibrated exactly
  once.  A call is the attention only if it is 4-D over the batch's tokens
  (``(B, H, L, L)`` weights, or SDPA on ``(B, H, L, D)`` queries and keys) and, for a
  softmax, normalises the last dimension; anything else passes through untouched.

A softmax call: the stock weights are kept and the calibrated rows replaced (the
pooling row, or every row with ``queries="all"``), computed in float32 and returned in
the softmax's dtype.  An SDPA call: the stock kernel runs for all rows and the pooling
row is recomputed explicitly and written in; ``queries="all"`` computes the layer
explicitly in tiles -- the registry backend's :func:`~posfair.calibration.kernels.attend`.

After the forward, :func:`verify` checks that every calibrated / recorded layer saw
exactly one attention call per module call, so a model whose attention cannot be
recognised fails loudly instead of returning stock (or doubly calibrated) numbers.
"""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode

from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.kernels import attend
from posfair.calibration.state import ForwardState, active_state

__all__ = ["LayerMode", "find_layer_attention_modules", "install", "layer_map", "active", "verify"]

# every spelling of softmax, as a torch-function mode sees it
_SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax, torch._softmax)
_SDPA = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_INSTALL_LOCK = threading.Lock()


def find_layer_attention_modules(model: nn.Module, num_layers: int) -> list[nn.Module]:
    """The attention module of each transformer layer, found structurally.

    The layer stack is the ``nn.ModuleList`` of length ``num_layers``; in each layer the
    first submodule whose class name contains "Attention" is its attention.
    """
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    for stack in stacks:
        found = []
        for layer in stack:
            att = next((m for m in layer.modules() if m is not layer and "attention" in type(m).__name__.lower()), None)
            if att is None:
                break
            found.append(att)
        if len(found) == num_layers:
            return found
    raise TypeError(
        f"posfair cannot calibrate {type(model).__name__}: its attention does not go through transformers' "
        f"AttentionInterface and no stack of {num_layers} layers with an attention submodule was found"
    )


def layer_map(attention_modules: list[nn.Module]) -> dict[int, int]:
    """id(attention module) -> layer index, for :attr:`ForwardState.fallback_layers`."""
    return {id(m): i for i, m in enumerate(attention_modules)}


# -- hooks (module-level functions: a model with them installed still pickles / deep-copies) ----------


def _pre_hook(module: nn.Module, args) -> None:
    state = active_state()
    if state is None:
        return None
    layer = state.fallback_layers.get(id(module))
    if layer is None:
        return None
    calibrate, record = state.layer_wants(layer)
    if not (calibrate or record):
        return None
    mode = LayerMode(state, layer, calibrate, record)
    mode.__enter__()
    state.fallback_active.append((id(module), mode))
    return None


def _post_hook(module: nn.Module, args, output) -> None:
    state = active_state()
    if state is None or not state.fallback_active or state.fallback_active[-1][0] != id(module):
        return None
    _, mode = state.fallback_active.pop()
    _leave(mode)
    state.fallback_calls.setdefault(mode.layer, []).append(mode.calls)
    return None


def _leave(mode: LayerMode) -> None:
    if _get_current_function_mode() is not mode:
        raise RuntimeError("posfair: the torch-function mode stack changed inside an attention module")
    mode.__exit__(None, None, None)


def install(attention_modules: list[nn.Module]) -> None:
    """Give each attention module posfair's hooks (once: a module that has them, e.g. a deep copy, keeps them)."""
    with _INSTALL_LOCK:
        for mod in attention_modules:
            if _pre_hook not in mod._forward_pre_hooks.values():
                mod.register_forward_pre_hook(_pre_hook)
            if _post_hook not in mod._forward_hooks.values():
                mod.register_forward_hook(_post_hook, prepend=True, always_call=True)


@contextlib.contextmanager
def active(state: ForwardState) -> Iterator[ForwardState]:
    """Around a forward pass: any layer mode still pushed when it ends (the forward hook did not run) is left."""
    try:
        yield state
    finally:
        while state.fallback_active:
            _, mode = state.fallback_active.pop()
            _leave(mode)


def verify(state: ForwardState, model_name: str, probe: bool = False) -> None:
    """TypeError unless every calibrated / recorded layer saw exactly one attention call per module call."""
    wanted = sorted({layer for layer in state.fallback_layers.values() if any(state.layer_wants(layer))})
    missing = [layer for layer in wanted if not state.fallback_calls.get(layer) or 0 in state.fallback_calls[layer]]
    if missing:
        where = "" if probe else f" in this forward pass (sequence length {state.length})"
        raise TypeError(
            f"posfair cannot calibrate {model_name}: its attention neither goes through transformers' AttentionInterface "
            f"nor computes a softmax / scaled_dot_product_attention over (batch, heads, tokens, tokens) that could be "
            f"intercepted{where} (layers without a hit: {missing})"
        )
    repeated = {layer: max(state.fallback_calls[layer]) for layer in wanted if max(state.fallback_calls[layer]) > 1}
    if repeated:
        raise TypeError(
            f"posfair cannot calibrate {model_name}: attention modules made several attention-shaped softmax / "
            f"scaled_dot_product_attention calls in one call (layer: calls {repeated}); which one is the attention is ambiguous"
        )


# -- the per-layer interception -----------------------------------------------------------------------


def _softmax_over_last(dim, ndim: int) -> bool:
    """Whether ``dim`` is the last dimension (``dim=None``, softmax's legacy implicit dim, never is for 4-D)."""
    if dim is None or isinstance(dim, bool):
        return False
    try:
        return operator.index(dim) in (-1, ndim - 1)
    except TypeError:  # a named dimension
        return False


class LayerMode(TorchFunctionMode):
    """Active (in one thread) while a calibrated / recorded layer's attention module runs."""

    def __init__(self, state: ForwardState, layer: int, calibrate: bool, record: bool) -> None:
        super().__init__()
        self.state, self.layer, self.calibrate, self.record = state, layer, calibrate, record
        self.calls = 0  # attention calls seen; only the first is calibrated (verify() rejects more)

    def _attention_shaped(self, t: torch.Tensor, rows_must_match: bool = True) -> bool:
        st = self.state
        if t.dim() != 4 or not t.is_floating_point() or t.shape[0] != st.start.shape[0]:
            return False
        L = st.length
        if L is None:
            return t.shape[-2] > int(st.end.max())
        return t.shape[-2] == L and (not rows_must_match or t.shape[-1] == L)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(func is f for f in _SOFTMAX):
            out = func(*args, **kwargs)
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if isinstance(out, torch.Tensor) and self._attention_shaped(out) and _softmax_over_last(dim, out.dim()):
                self.calls += 1
                if self.calls == 1:
                    return self._softmax(out)
            return out
        if func is _SDPA:
            a = dict(zip(_SDPA_ARGS, args, strict=False), **kwargs)  # positional arguments, then keywords
            q, k = a.get("query"), a.get("key")
            if (
                isinstance(q, torch.Tensor)
                and isinstance(k, torch.Tensor)
                and self._attention_shaped(q, False)
                and self._attention_shaped(k, False)
            ):
                self.calls += 1
                if self.calls == 1:
                    return self._sdpa(func, args, kwargs, a)
        return func(*args, **kwargs)

    def _softmax(self, out: torch.Tensor) -> torch.Tensor:
        """Calibrate / record the post-softmax weights (B, H, L, L) of one attention call."""
        st = self.state
        B, _, Lq, _ = out.shape
        dev = out.device
        b = torch.arange(B, device=dev)
        start, end = st.start.to(dev), st.end.to(dev)
        exact = out.dtype in (torch.float32, torch.float64)
        res = out
        if self.calibrate:
            settings = st.baskets(self.layer)
            if st.calibration.queries == "all":
                # every row of a sequence shares its span (padding query rows too: harmless, never pooled)
                res = (out.clone() if out.requires_grad else out) if exact else out.float()
                settings = settings.for_heads((res.shape[1], 1), res)
                for i, (s, e) in enumerate(zip(st.start.tolist(), st.end.tolist(), strict=True)):
                    calibrate_span_(res[i], s, e, settings)
            else:
                settings = settings.for_heads((out.shape[1],), out)
                rows = st.pool_rows().to(dev)
                self_key = rows.view(B, 1) if settings.self_share is not None else None
                cal = calibrate_rows(out[b, :, rows], start.view(B, 1), end.view(B, 1), settings, self_key=self_key)
                res = out.clone() if out.requires_grad else out
                res[b, :, rows] = cal.to(out.dtype)
        if self.record:
            if st.record_queries == "all":
                q = torch.arange(Lq, device=dev).view(1, -1)
                valid = ((q >= start.view(B, 1)) & (q <= end.view(B, 1))).float()  # (B, Lq)
                rec = torch.einsum("bhqk,bq->bhk", res.float(), valid) / valid.sum(1).view(B, 1, 1)
            else:
                rec = res[b, :, st.pool_rows().to(dev)].float()
            st.recorder(self.layer, rec)
        return res.to(out.dtype)

    def _sdpa(self, func, args: tuple, kwargs: dict, a: dict) -> torch.Tensor:
        """One SDPA call: the stock kernel for all rows + the pooling row explicitly (or the tiled explicit path)."""
        query, key, value = a["query"], a["key"], a["value"]
        scale = a.get("scale")
        scaling = scale if scale is not None else query.shape[-1] ** -0.5
        mask = a.get("attn_mask")
        if mask is not None:
            while mask.dim() < 4:
                mask = mask.unsqueeze(0)
            mask = mask.expand(*mask.shape[:3], key.shape[-2])  # (B|1, 1|H, L|1, K): what attend() takes
        extra = {"is_causal": bool(a.get("is_causal", False))}
        layer = SimpleNamespace(layer_idx=self.layer, is_causal=extra["is_causal"])  # what attend() reads of a module

        def stock() -> torch.Tensor:
            return func(*args, **kwargs).transpose(1, 2)  # (B, L, H, D)

        dropout = float(a.get("dropout_p") or 0.0)  # > 0 only in training mode
        out = attend(
            layer, query, key, value, mask, scaling, self.state, self.calibrate, self.record, extra, stock, dropout
        )
        return out.transpose(1, 2).contiguous()  # SDPA's (B, H, L, D)
