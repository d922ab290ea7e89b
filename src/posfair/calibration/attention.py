"""Wiring calibration into a model's attention.

Two mechanisms, chosen per model by a probe (:func:`detect_mode`):

``registry`` (transformers 5.x: BERT, XLM-RoBERTa, ModernBERT, Qwen3, most
current architectures; transformers 4.x: Qwen3 and the other architectures that
dispatch through ``ALL_ATTENTION_FUNCTIONS`` -- see :mod:`posfair.compat`).  The model's attention implementation is switched to a
name registered in transformers' ``AttentionInterface`` (and, for its masks,
``AttentionMaskInterface``).  The registered function calls the stock kernel
(SDPA or eager) for all rows; in calibrated layers it then recomputes the
pooling token's row explicitly (``q_pool @ K^T -> softmax -> calibrate -> @ V``)
and writes it into the output.  No (heads x L x L) matrix is ever formed.  With
``queries="all"`` (mean pooling) every valid row is calibrated: the layer is
computed explicitly in tiles of query rows so memory stays bounded.

``fallback`` (remote-code models computing softmax inside their own modules,
e.g. gte-multilingual-base, jina-v3; on transformers 4.x also BERT, XLM-RoBERTa
and ModernBERT, which pick their attention classes themselves): see :mod:`posfair.calibration.fallback`.
It reuses this module's state and its explicit-row helpers (:func:`attend`).

When no calibration is active the registered function is exactly the stock
kernel, so a model switched to it produces bit-identical embeddings.

A :class:`ForwardState` is active for the duration of one forward pass (a
``ContextVar``), holding the resolved calibration, each sequence's valid span
(from the 2D padding mask) and an optional recorder of the pooling token's
attention rows (used by the attention profile).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.params import ResolvedCalibration
from posfair.compat import attention_registries, sdpa_attention_forward

ATTN_SDPA = "posfair_sdpa"
ATTN_EAGER = "posfair_eager"  # explicit full-matrix path: the slow reference and the "naive" benchmark baseline
TILE_BYTES = 32 * 2**20  # budget for one tile of explicit scores in the all-rows path

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

    def wants(self, module: nn.Module) -> tuple[bool, bool]:
        """(calibrate, record) for this attention module."""
        if id(getattr(module, "config", None)) not in self.config_ids:
            return False, False
        layer = getattr(module, "layer_idx", None)
        if layer is None:
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
    return _STATE.get()


@contextlib.contextmanager
def forward_state(state: ForwardState) -> Iterator[ForwardState]:
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def spans_from_mask(attention_mask: torch.Tensor | None, batch: int, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last valid position per sequence from a 2D (B, L) padding mask."""
    if attention_mask is None:
        return (torch.zeros(batch, dtype=torch.long, device=device), torch.full((batch,), length - 1, dtype=torch.long, device=device))
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


def _calib_kwargs(cal: ResolvedCalibration) -> dict:
    return dict(
        basket_size=cal.basket_size,
        strength=cal.strength,
        isolate_bos=cal.isolate_bos,
        isolate_eos=cal.isolate_eos,
        bos_weight=cal.bos_weight,
        eos_weight=cal.eos_weight,
    )


def _mask_to_additive(mask: torch.Tensor | None, dtype=torch.float32) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return torch.where(mask, zero, torch.finfo(dtype).min)
    return mask.to(dtype).clamp(min=torch.finfo(dtype).min)  # -inf would turn fully masked rows into NaN


def _is_causal(module: nn.Module, kwargs: dict) -> bool:
    flag = kwargs.get("is_causal")
    return bool(flag if flag is not None else getattr(module, "is_causal", False))


def _check_supported(kwargs: dict) -> None:
    for name in ("softcap", "position_bias", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise ValueError(f"posfair attention calibration does not support attention with `{name}`")


def _grouped(query: torch.Tensor, key: torch.Tensor) -> tuple[int, int]:
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) are not a multiple of key/value heads ({kv_heads})")
    return kv_heads, heads // kv_heads


def _explicit_probs(
    q: torch.Tensor,
    key: torch.Tensor,
    mask_rows: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """softmax(q K^T * scaling + mask) for grouped queries.

    q: (B, Hkv, g, T, D); key: (B, Hkv, K, D); mask_rows: additive, broadcastable to (B, Hkv, g, T, K).
    """
    # masks are additive with finite minima (never -inf), so a fully masked row is uniform, never NaN
    scores = torch.matmul(q.float() * scaling, key.float().transpose(-1, -2).unsqueeze(2))
    if mask_rows is not None:
        scores.add_(mask_rows)
    return torch.softmax(scores, dim=-1)


def _mask_for_rows(attention_mask: torch.Tensor | None, rows: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor | None:
    """Additive mask for one query row per sequence: (B, Hkv|1, g|1, 1, K).

    ``attention_mask``: (B|1, Hm, L|1, K) with Hm = 1 or heads; the rows are picked before
    the conversion to an additive float mask, so no full float copy of the mask is made.
    """
    if attention_mask is None:
        return None
    B = rows.shape[0]
    m = attention_mask.expand(B, *attention_mask.shape[1:])
    r = rows.to(m.device) if m.shape[2] > 1 else torch.zeros_like(rows, device=m.device)
    picked = _mask_to_additive(m[torch.arange(B, device=m.device), :, r])  # (B, Hm, K)
    if picked.shape[1] == 1:
        return picked[:, :, None, None, :]  # (B,1,1,1,K)
    return picked.view(B, kv_heads, heads // kv_heads, 1, -1)


def _mask_for_tile(attention_mask: torch.Tensor | None, t0: int, t1: int, heads: int, kv_heads: int, B: int) -> torch.Tensor | None:
    if attention_mask is None:
        return None
    rows = attention_mask[:, :, t0:t1] if attention_mask.shape[2] > 1 else attention_mask
    tile = _mask_to_additive(rows)  # (B|1, Hm, T|1, K)
    if tile.shape[1] == 1:
        return tile.unsqueeze(2)  # (B|1, 1, 1, T, K)
    return tile.reshape(tile.shape[0], kv_heads, heads // kv_heads, *tile.shape[2:])


def _causal_additive(t0: int, t1: int, K: int, device) -> torch.Tensor:
    rows = torch.arange(t0, t1, device=device)[:, None]
    keys = torch.arange(K, device=device)[None, :]
    return torch.where(keys <= rows, 0.0, torch.finfo(torch.float32).min)


def pool_row_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    state: ForwardState,
    calibrate: bool,
    record: bool,
    kwargs: dict,
) -> torch.Tensor:
    """The pooling token's attention output (B, H, D), calibrated if asked; records the row."""
    B, H, L, D = query.shape
    kv_heads, groups = _grouped(query, key)
    rows = state.pool_rows().to(query.device)
    q = query[torch.arange(B, device=query.device), :, rows].view(B, kv_heads, groups, 1, D)
    mask = _mask_for_rows(attention_mask, rows, H, kv_heads)
    if mask is None and _is_causal(module, kwargs) and L > 1:
        K = key.shape[2]
        causal = torch.where(torch.arange(K, device=query.device)[None, :] <= rows[:, None], 0.0, torch.finfo(torch.float32).min)
        mask = causal[:, None, None, None, :]
    probs = _explicit_probs(q, key, mask, scaling)  # (B, Hkv, g, 1, K)
    if calibrate:
        cal = state.calibration
        probs = calibrate_rows(probs, state.start.view(B, 1, 1, 1), state.end.view(B, 1, 1, 1), **_calib_kwargs(cal))
    if record:
        state.recorder(module.layer_idx, probs.reshape(B, H, -1))
    out = torch.matmul(probs.to(value.dtype), value.unsqueeze(2))  # (B, Hkv, g, 1, D)
    return out.reshape(B, H, D)


def explicit_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    state: ForwardState | None,
    calibrate_rows_mode: str | None,
    record: bool,
    kwargs: dict,
    tile_rows: int | None = None,
    naive: bool = False,
) -> torch.Tensor:
    """Attention computed explicitly, tiled over query rows; returns (B, L, H, D).

    ``calibrate_rows_mode``: None (stock), "pool" or "all" — which rows get calibrated.
    With ``tile_rows=None`` the tile size follows :data:`TILE_BYTES`.  ``naive=True``
    is the hook-style baseline: the full matrix in one tile, calibrated with the
    general per-row function (the benchmark's "naive" path and a slow cross-check).
    """
    B, H, L, D = query.shape
    K = key.shape[2]
    kv_heads, groups = _grouped(query, key)
    if naive:
        tile_rows = L
    elif tile_rows is None:
        tile_rows = max(1, min(L, TILE_BYTES // max(1, B * H * K * 4)))
    causal = attention_mask is None and _is_causal(module, kwargs) and L > 1
    q_all = query.view(B, kv_heads, groups, L, D)
    out = torch.empty(B, L, H, D, dtype=value.dtype, device=value.device)
    rec_sum = None
    if record and state is not None:
        rec_sum = torch.zeros(B, H, K, dtype=torch.float32, device=query.device)
    if state is not None:
        start = state.start.view(B, 1, 1, 1).to(query.device)
        end = state.end.view(B, 1, 1, 1).to(query.device)
    for t0 in range(0, L, tile_rows):
        t1 = min(L, t0 + tile_rows)
        mask = _mask_for_tile(attention_mask, t0, t1, H, kv_heads, B)
        if causal:
            c = _causal_additive(t0, t1, K, query.device)
            mask = c if mask is None else mask + c
        probs = _explicit_probs(q_all[:, :, :, t0:t1], key, mask, scaling)  # (B, Hkv, g, T, K)
        if calibrate_rows_mode == "all" and not naive:
            # fast path: every row of a sequence shares its span; padding query rows are calibrated
            # too, which is harmless (their outputs only reach masked keys and are never pooled)
            kw = _calib_kwargs(state.calibration)
            for b, (s_b, e_b) in enumerate(zip(state.start.tolist(), state.end.tolist())):
                calibrate_span_(probs[b], s_b, e_b, **kw)
        elif calibrate_rows_mode == "pool" and state is not None:
            # only the pooling row is calibrated (what a hook on eager weights does)
            pool = state.pool_rows().to(query.device)
            inside = (pool >= t0) & (pool < t1)
            if bool(inside.any()):
                b_idx = torch.arange(B, device=query.device)
                r_idx = (pool - t0).clamp(0, t1 - t0 - 1)
                row = probs[b_idx, :, :, r_idx]  # (B, Hkv, g, K)
                cal = calibrate_rows(row, start.view(B, 1, 1), end.view(B, 1, 1), **_calib_kwargs(state.calibration))
                probs[b_idx, :, :, r_idx] = torch.where(inside.view(B, 1, 1, 1), cal, row)
        elif calibrate_rows_mode == "all" and state is not None:
            cal = calibrate_rows(probs, start, end, **_calib_kwargs(state.calibration))
            rows = torch.arange(t0, t1, device=query.device).view(1, 1, 1, -1)
            probs = torch.where(((rows >= start) & (rows <= end)).unsqueeze(-1), cal, probs)
        if rec_sum is not None:
            if state.record_queries == "all":
                rows = torch.arange(t0, t1, device=query.device).view(1, 1, 1, -1)
                valid = ((rows >= start) & (rows <= end)).unsqueeze(-1).float()
                rec_sum += (probs * valid).sum(dim=3).reshape(B, H, K)
            else:
                pool = state.pool_rows().to(query.device)
                inside = (pool >= t0) & (pool < t1)
                if bool(inside.any()):
                    idx = (pool - t0).clamp(0, t1 - t0 - 1)
                    picked = probs[torch.arange(B, device=query.device), :, :, idx]  # (B, Hkv, g, K)
                    rec_sum += picked.reshape(B, H, K) * inside.view(B, 1, 1).float()
        o = torch.matmul(probs.to(value.dtype), value.unsqueeze(2))  # (B, Hkv, g, T, D)
        out[:, t0:t1] = o.reshape(B, H, t1 - t0, D).transpose(1, 2)
    if rec_sum is not None:
        if state.record_queries == "all":
            n = (state.end - state.start + 1).to(rec_sum.device).float().view(B, 1, 1)
            rec_sum = rec_sum / n
        state.recorder(module.layer_idx, rec_sum)
    return out


def attend(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    state: ForwardState,
    calibrate: bool,
    record: bool,
    kwargs: dict,
    stock: Callable[[], torch.Tensor],
) -> torch.Tensor:
    """The attention output (B, L, H, D) of a calibrated and/or recorded layer.

    ``stock()`` runs the stock kernel for all rows (returning (B, L, H, D)); the pooling
    row is then recomputed explicitly and written in.  When every valid row is calibrated
    (``queries="all"``) or recorded, the layer is computed explicitly in tiles instead.
    Shared by the registry function and the fallback's intercepted SDPA call.
    """
    _check_supported(kwargs)
    if calibrate and state.calibration.queries == "all":
        return explicit_attention(module, query, key, value, attention_mask, scaling, state, "all", record, kwargs)
    if record and state.record_queries == "all":
        # profile of a mean-pooled model: tiled explicit pass, output identical up to float rounding
        return explicit_attention(module, query, key, value, attention_mask, scaling, state, "pool" if calibrate else None, record, kwargs)
    out = stock()
    rows = state.pool_rows().to(out.device)
    row_out = pool_row_attention(module, query, key, value, attention_mask, scaling, state, calibrate, record, kwargs)
    B = out.shape[0]
    return out.index_put((torch.arange(B, device=out.device), rows), row_out.to(out.dtype))


def _make_attention_function(base: str) -> Callable:
    def posfair_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        state = _STATE.get()
        calibrate, record = state.wants(module) if state is not None else (False, False)
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        if base == "eager_explicit":
            if state is not None and (calibrate or record):
                _check_supported(kwargs)
            mode = state.calibration.queries if calibrate else None
            out = explicit_attention(module, query, key, value, attention_mask, scaling, state, mode, record, kwargs, naive=True)
            return out, None
        if not (calibrate or record):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

        def stock() -> torch.Tensor:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)[0]

        return attend(module, query, key, value, attention_mask, scaling, state, calibrate, record, kwargs, stock), None

    posfair_attention.__name__ = f"posfair_attention_{base}"
    return posfair_attention


_REGISTERED = False


def register() -> None:
    """Register posfair's attention functions (and their mask builders) with transformers."""
    global _REGISTERED
    if _REGISTERED:
        return
    AttentionInterface, AttentionMaskInterface, sdpa_mask, eager_mask = attention_registries()
    AttentionInterface.register(ATTN_SDPA, _make_attention_function("sdpa"))
    AttentionInterface.register(ATTN_EAGER, _make_attention_function("eager_explicit"))
    # Without a mask function registered under the same name, transformers would pass
    # attention_mask=None and padding would be silently ignored.
    AttentionMaskInterface.register(ATTN_SDPA, sdpa_mask)
    AttentionMaskInterface.register(ATTN_EAGER, eager_mask)
    _REGISTERED = True
