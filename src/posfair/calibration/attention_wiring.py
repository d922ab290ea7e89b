"""Wiring calibration into a model's attention: the engine's entry point for the model layer.

Two backends, chosen per model by a probe (``CalibratedTransformer.mechanism``),
one module each:

``registry`` (:mod:`posfair.calibration.registry`; transformers 5.x: BERT,
XLM-RoBERTa, ModernBERT, Qwen3, most current architectures; transformers 4.x:
Qwen3 and the other architectures that dispatch through ``ALL_ATTENTION_FUNCTIONS``
-- see :mod:`posfair.model.compat`).  The model's attention implementation is switched to
a name registered in transformers' ``AttentionInterface``; the registered function
runs the stock kernel and recomputes the calibrated rows explicitly.

``fallback`` (:mod:`posfair.calibration.fallback`; remote-code models computing
softmax inside their own modules, e.g. gte-multilingual-base, jina-v3; on
transformers 4.x also BERT, XLM-RoBERTa and ModernBERT, which pick their attention
classes themselves): a scoped torch-function mode intercepts each layer's softmax
or SDPA call.

On transformers 4.x, calibrated folders of BERT, RoBERTa, XLM-RoBERTa and ModernBERT
load through :mod:`posfair.calibration.transformers4` (a ``"posfair_sdpa"`` entry in
each architecture's own attention table, running the fallback's per-layer mode).

All read the :class:`~posfair.calibration.state.ForwardState` of the running
forward pass (:mod:`posfair.calibration.state`) and share the explicit kernels of
:mod:`posfair.calibration.kernels` (the pooling row computed explicitly; tiled
explicit attention when every row is calibrated), so they calibrate identically.

This module gathers the names the model layer uses; each lives in one of the
modules above.
"""

from __future__ import annotations

from posfair.calibration.kernels import TILE_BYTES, attend, explicit_attention, pool_row_attention
from posfair.calibration.registry import ATTN_EAGER, ATTN_SDPA, register
from posfair.calibration.state import ForwardState, Recorder, active_state, forward_state, spans_from_mask

__all__ = [
    "ATTN_EAGER",
    "ATTN_SDPA",
    "TILE_BYTES",
    "ForwardState",
    "Recorder",
    "active_state",
    "attend",
    "explicit_attention",
    "forward_state",
    "pool_row_attention",
    "register",
    "spans_from_mask",
]
