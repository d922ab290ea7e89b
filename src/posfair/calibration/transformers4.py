"""Calibrated folders on transformers 4.x for BERT, RoBERTa, XLM-RoBERTa and ModernBERT.

A calibrated folder saved by posfair names ``attn_implementation="posfair_sdpa"``
(:mod:`posfair.calibration.registry`).  transformers 5.x sends every attention call of
these architectures through its registry, so the registered function is all it takes.
On transformers 4.x they pick their attention from a table of their own, keyed by the
implementation name (``BERT_SELF_ATTENTION_CLASSES``, ``MODERNBERT_ATTENTION_FUNCTION``,
...).  :func:`extend` adds a ``"posfair_sdpa"`` entry to each table when its modelling
module is imported (a new key: the stock entries are untouched; which tables: the rows of
:mod:`posfair.calibration.backends`): the stock SDPA class /
function, run inside the fallback backend's per-layer interception
(:class:`~posfair.calibration.fallback.LayerMode`), which lets the stock SDPA kernel
compute all rows and recomputes the pooling row explicitly (or the layer in tiles).

The calibration comes from the running posfair forward pass (``FairModel``) or, for a
folder loaded with plain ``SentenceTransformer(path)``, from the model config
(:func:`~posfair.calibration.state.config_state`).  Other architectures that pick
their attention themselves on 4.x are not covered: load such folders with
``posfair.load_model``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import torch
from torch import nn

from posfair.calibration.backends import ATTN_SDPA, attention_tables
from posfair.calibration.fallback import LayerMode
from posfair.calibration.state import active_state, config_state, forward_state

__all__ = ["extend", "on_import"]

# modelling module -> (table, whether its entries are classes or functions): rows of the table of backends
_TABLES = attention_tables()


def calibrated_call(
    module: nn.Module,
    layer: int,
    attention_mask: torch.Tensor | None,
    batch: int,
    length: int,
    device,
    call: Callable[[], tuple],
) -> tuple:
    """Run ``call()`` (the stock attention of ``module``, layer ``layer``) calibrated / recorded as the
    running posfair forward pass asks, else as ``module.config`` asks, else stock."""
    state = active_state()
    scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    if state is None:
        state = config_state(module, attention_mask, batch, length, device)
        if state is None:
            return call()
        scope = forward_state(state)
    calibrate, record = state.wants_layer(module, layer)
    if not (calibrate or record):
        return call()
    mode = LayerMode(state, layer, calibrate, record)
    with scope, mode:
        out = call()
    if mode.calls != 1:
        raise TypeError(
            f"posfair cannot calibrate {type(module).__name__} (layer {layer}): expected one attention call, saw {mode.calls}"
        )
    return out


def _calibrating_class(base: type) -> type:
    """A subclass of the stock SDPA self-attention class ``base`` that runs calibrated."""

    def __init__(self, config, *args, **kwargs):
        base.__init__(self, config, *args, **kwargs)
        self.config = config  # what ForwardState.wants_layer identifies the model by

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        B, L = hidden_states.shape[:2]
        return calibrated_call(
            self,
            self.layer_idx,
            attention_mask,
            B,
            L,
            hidden_states.device,
            lambda: base.forward(self, hidden_states, attention_mask, *args, **kwargs),
        )

    name = f"Posfair{base.__name__}"
    cls = type(name, (base,), {"__init__": __init__, "forward": forward, "__module__": __name__, "__qualname__": name})
    globals()[name] = cls  # importable by name, so a model holding it pickles (multi-process encoding)
    return cls


def _calibrating_function(stock: Callable) -> Callable:
    """ModernBERT's attention function ``stock`` (SDPA), run calibrated."""

    def posfair_sdpa_attention_forward(module, qkv, attention_mask, *args, **kwargs):
        B, L = qkv.shape[:2]
        return calibrated_call(
            module,
            module.layer_id,
            attention_mask,
            B,
            L,
            qkv.device,
            lambda: stock(module, qkv, attention_mask, *args, **kwargs),
        )

    return posfair_sdpa_attention_forward


def extend(module) -> None:
    """Add posfair's entry to the attention table of the (fully imported) modelling module ``module``
    (transformers 4.x; on 5.x, where these tables are gone, nothing happens)."""
    table_name, kind = _TABLES[module.__name__]
    table = getattr(module, table_name, None)
    if not isinstance(table, dict) or "sdpa" not in table or ATTN_SDPA in table:
        return
    table[ATTN_SDPA] = _calibrating_class(table["sdpa"]) if kind == "class" else _calibrating_function(table["sdpa"])


def __getattr__(name: str):  # unpickling in a fresh process: build the class from its architecture's table
    for module_name, (_table, kind) in _TABLES.items():
        if kind == "class":
            module = importlib.import_module(module_name)
            extend(module)
            if name in globals():
                return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def on_import(module) -> None:
    """The hook ``posfair/__init__.py`` runs once an attention table's modelling module is imported
    (:func:`posfair.calibration.backends.import_hooks`)."""
    extend(module)
