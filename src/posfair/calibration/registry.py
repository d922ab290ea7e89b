"""The registry backend: calibration through transformers' attention registry.

Used for transformers 5.x (BERT, XLM-RoBERTa, ModernBERT, Qwen3, most current
architectures) and, on transformers 4.x, Qwen3 and the other architectures that
dispatch through ``ALL_ATTENTION_FUNCTIONS`` (which ones: :mod:`posfair.calibration.backends`).  The
model's attention implementation is switched to a name registered in
transformers' ``AttentionInterface`` (and, for its masks, ``AttentionMaskInterface``).
The registered function calls the stock SDPA kernel for all rows; in calibrated
or recorded layers it hands over to :func:`~posfair.calibration.kernels.attend`,
which recomputes the pooling row explicitly (or the whole layer in tiles).

When no calibration is active the registered function is exactly the stock
kernel, so a model switched to it produces bit-identical embeddings.

Outside a posfair forward pass (no :class:`~posfair.calibration.state.ForwardState`:
a calibrated folder loaded with plain ``SentenceTransformer(path)`` or
``AutoModel.from_pretrained(path)`` after ``import posfair``) the function reads the
calibration from the attention module's config (``posfair_calibration`` /
``posfair_pooling``, stored in the folder's ``config.json`` whose
``attn_implementation`` names this function) and each sequence's valid span from
the layer's attention mask (:func:`~posfair.calibration.state.config_state`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from posfair.calibration.backends import ATTN_EAGER, ATTN_SDPA  # the names (ATTN_EAGER: the explicit full-matrix path)
from posfair.calibration.kernels import attend, check_supported, explicit_attention
from posfair.calibration.state import active_state, config_state

__all__ = ["ATTN_SDPA", "ATTN_EAGER", "on_import", "register"]


def _make_attention_function(base: str) -> Callable:
    def posfair_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        state = active_state()
        if (
            state is None
        ):  # a calibrated folder loaded without posfair's model class: the calibration is in module.config
            state = config_state(module, attention_mask, query.shape[0], key.shape[-2], query.device)
        calibrate, record = state.wants(module) if state is not None else (False, False)
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if base == "eager_explicit":
            if state is not None and (calibrate or record):
                check_supported(kwargs)
            mode = state.calibration.queries if calibrate else None
            out = explicit_attention(
                module,
                query,
                key,
                value,
                attention_mask,
                scaling,
                state,
                mode,
                record,
                kwargs,
                naive=True,
                dropout=dropout,
            )
            return out, None
        if not (calibrate or record):
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )

        def stock() -> torch.Tensor:
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )[0]

        return attend(
            module, query, key, value, attention_mask, scaling, state, calibrate, record, kwargs, stock, dropout
        ), None

    posfair_attention.__name__ = f"posfair_attention_{base}"
    return posfair_attention


_REGISTERED = False


def register() -> None:
    """Register posfair's attention functions (and their mask builders) with transformers.

    Runs when transformers' modelling code is first imported after ``import posfair``
    (:func:`on_import`, hooked by ``posfair/__init__.py`` from :mod:`posfair.calibration.backends`), so
    calibrated folders load with plain ``SentenceTransformer(path)``; idempotent.  (On transformers 4.x
    the BERT family's own attention tables are extended by their own hooks:
    :mod:`posfair.calibration.transformers4`.)"""
    global _REGISTERED
    if _REGISTERED:
        return
    AttentionInterface.register(ATTN_SDPA, _make_attention_function("sdpa"))
    AttentionInterface.register(ATTN_EAGER, _make_attention_function("eager_explicit"))
    # Without a mask function registered under the same name, transformers would pass
    # attention_mask=None and padding would be silently ignored.
    AttentionMaskInterface.register(ATTN_SDPA, sdpa_mask)
    AttentionMaskInterface.register(ATTN_EAGER, eager_mask)
    _REGISTERED = True


def on_import(_module) -> None:
    """The hook ``posfair/__init__.py`` runs once ``transformers.modeling_utils`` is imported
    (:func:`posfair.calibration.backends.import_hooks`)."""
    register()


# importing this module imports transformers.modeling_utils (AttentionInterface lives there); when nothing had
# imported it before, its hook (posfair.calibration.backends.import_hooks) found this module incomplete and left the
# registration to it, now that it is complete
on_import(None)
