"""The forward state: what one forward pass asks of the attention backends.

A :class:`ForwardState` is active for the duration of one forward pass (a
``ContextVar``, so threads and async tasks each see their own), holding the
resolved calibration, each sequence's valid span (from the 2D padding mask) and
an optional recorder of the pooling token's attention rows (used by the
attention profile).  Both backends -- the registry function
(:mod:`posfair.calibration.registry`) and the fallback interception
(:mod:`posfair.calibration.fallback`) -- read it; the model layer sets it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from posfair.calibration.params import BasketSettings, Calibration, ResolvedCalibration

__all__ = [
    "Recorder",
    "ForwardState",
    "active_state",
    "config_calibration",
    "config_state",
    "forward_state",
    "spans_from_attention_mask",
    "spans_from_mask",
]

# recorder(layer_idx, rows) with rows of shape (batch, heads, keys): the pooling
# token's post-softmax (post-calibration) row, or for queries="all" the mean over
# valid query rows.
Recorder = Callable[[int, torch.Tensor], None]


@dataclass
class ForwardState:
    config_ids: frozenset[int]
    start: torch.Tensor  # (B,) first valid position
    end: torch.Tensor  # (B,) last valid position
    calibration: ResolvedCalibration | None = None
    recorder: Recorder | None = None
    record_layers: frozenset[int] = frozenset()
    record_queries: str = "pool"  # "pool" or "all"
    pooling: str = "cls"
    visited: set[int] = field(default_factory=set)
    # fallback backend (posfair.calibration.fallback) only:
    length: int | None = None  # tokens per sequence of the batch (the attention's query and key length)
    fallback_layers: dict[int, int] = field(default_factory=dict)  # id(attention module) -> layer index
    fallback_active: list = field(default_factory=list)  # (id(module), mode) pushed by the forward pre-hooks
    fallback_calls: dict[int, list[int]] = field(default_factory=dict)  # layer -> attention calls seen, per module call
    layer_baskets: dict[int | None, BasketSettings] = field(default_factory=dict, repr=False)  # built by baskets()

    def baskets(self, layer: int | None) -> BasketSettings:
        """What the basket formula reads in layer ``layer`` (:meth:`ResolvedCalibration.baskets`), built once per
        layer in this forward pass: every kernel, tile and check of the layer reads this one value."""
        got = self.layer_baskets.get(layer)
        if got is None:
            got = self.layer_baskets[layer] = self.calibration.baskets(layer)
        return got

    def wants(self, module: nn.Module) -> tuple[bool, bool]:
        """(calibrate, record) for this attention module."""
        if id(getattr(module, "config", None)) not in self.config_ids:
            return False, False
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            return False, False
        self.visited.add(layer)
        return self.layer_wants(layer)

    def wants_layer(self, module: nn.Module, layer: int) -> tuple[bool, bool]:
        """(calibrate, record) for ``module``, an attention module of layer ``layer`` (for modules that
        name their layer differently from ``layer_idx``)."""
        if id(getattr(module, "config", None)) not in self.config_ids:
            return False, False
        self.visited.add(layer)
        return self.layer_wants(layer)

    def layer_wants(self, layer: int) -> tuple[bool, bool]:
        """(calibrate, record) for layer ``layer``."""
        cal = self.calibration is not None and layer in self.calibration.layer_set
        rec = self.recorder is not None and layer in self.record_layers
        return cal, rec

    def pool_rows(self) -> torch.Tensor:
        return self.end if self.pooling == "lasttoken" else self.start


_STATE: contextvars.ContextVar[ForwardState | None] = contextvars.ContextVar("posfair_state", default=None)


def active_state() -> ForwardState | None:
    """The forward state of the forward pass running in this context (None outside one)."""
    return _STATE.get()


@contextlib.contextmanager
def forward_state(state: ForwardState) -> Iterator[ForwardState]:
    """Make ``state`` the active forward state for the block."""
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def spans_from_mask(
    attention_mask: torch.Tensor | None, batch: int, length: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last valid position per sequence from a 2D (B, L) padding mask."""
    if attention_mask is None:
        return (
            torch.zeros(batch, dtype=torch.long, device=device),
            torch.full((batch,), length - 1, dtype=torch.long, device=device),
        )
    m = attention_mask.bool()
    pos = torch.arange(m.shape[1], device=m.device)
    big = m.shape[1]
    start = torch.where(m, pos, big).min(dim=1).values
    end = torch.where(m, pos, -1).max(dim=1).values
    if bool((end < 0).any()):
        raise ValueError("a sequence in the batch has no valid token (all-zero attention mask)")
    n_valid = m.sum(1)
    if bool((n_valid != end - start + 1).any()):
        raise ValueError("posfair needs each sequence's valid tokens to be one contiguous span (left or right padding)")
    return start, end


def spans_from_attention_mask(
    attention_mask: torch.Tensor | None, batch: int, length: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last valid position per sequence from the mask an attention layer receives.

    ``attention_mask``: None (no padding), or 2-4 dimensional, boolean (True = attend) or additive
    float (0 = attend), of shape (B|1, heads|1, queries|1, keys) as transformers builds them.
    A key is valid when its own query row attends it (the diagonal): that holds for padding,
    causal and sliding-window masks alike, whichever row is the pooling token's.
    """
    if attention_mask is None:
        return spans_from_mask(None, batch, length, device)
    m = attention_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    m = m[:, 0]  # (B|1, Q|1, K): every head has the same padding
    if m.dtype != torch.bool:
        m = m > torch.finfo(m.dtype).min / 2
    if m.shape[-1] != length:
        raise ValueError(
            f"posfair: an attention mask over {m.shape[-1]} keys for {length} tokens (key/value caches are not supported)"
        )
    valid = m[:, 0, :] if m.shape[1] == 1 else torch.diagonal(m, dim1=-2, dim2=-1)
    return spans_from_mask(valid.expand(batch, length), batch, length, device)


#: the attributes of a transformers config that carry a calibration (written by ``FairModel.save``)
CONFIG_CALIBRATION_KEY = "posfair_calibration"
CONFIG_POOLING_KEY = "posfair_pooling"


@functools.lru_cache(maxsize=64)
def _resolved(calibration_json: str, pooling: str, num_layers: int) -> ResolvedCalibration:
    return Calibration.from_dict(json.loads(calibration_json)).resolve(pooling, num_layers)


def _num_layers(config) -> int | None:
    for cfg in (config, getattr(config, "text_config", None)):
        n = getattr(cfg, "num_hidden_layers", None) if cfg is not None else None
        if isinstance(n, int) and n > 0:
            return n
    return None


def config_calibration(config) -> ResolvedCalibration | None:
    """The calibration a transformers config carries (``posfair_calibration`` and ``posfair_pooling``,
    as a calibrated folder saved by posfair stores them in ``config.json``), resolved; None if none."""
    cal = getattr(config, CONFIG_CALIBRATION_KEY, None) if config is not None else None
    if cal is None:
        return None
    pooling = getattr(config, CONFIG_POOLING_KEY, None)
    layers = _num_layers(config)
    if not isinstance(cal, dict) or pooling is None or layers is None:
        raise ValueError(
            f"posfair: the model config's {CONFIG_CALIBRATION_KEY}={cal!r} needs a dict, {CONFIG_POOLING_KEY} "
            f"(got {pooling!r}) and num_hidden_layers (got {layers!r})"
        )
    return _resolved(json.dumps(cal, sort_keys=True), pooling, layers)


def config_state(
    module: nn.Module, attention_mask: torch.Tensor | None, batch: int, length: int, device
) -> ForwardState | None:
    """The forward state of a model loaded from a calibrated folder *without* posfair's model class
    (plain ``SentenceTransformer(path)`` or ``AutoModel.from_pretrained(path)`` after ``import posfair``):
    the calibration comes from ``module.config``, the spans from the layer's attention mask.
    None when the config carries no calibration (then the layer runs stock)."""
    config = getattr(module, "config", None)
    resolved = config_calibration(config)
    if resolved is None:
        return None
    start, end = spans_from_attention_mask(attention_mask, batch, length, device)
    return ForwardState(
        frozenset({id(config)}), start, end, calibration=resolved, pooling=resolved.pooling, length=length
    )
