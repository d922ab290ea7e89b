"""Explicit attention kernels: the pooling row computed explicitly, and tiled explicit attention.

Both backends (:mod:`posfair.calibration.registry`, :mod:`posfair.calibration.fallback`)
end in :func:`attend`: the stock kernel (SDPA or eager) runs for all rows, then the
pooling token's row is recomputed explicitly (``q_pool @ K^T -> softmax -> calibrate
-> @ V``, :func:`pool_row_attention`) and written into the output, so no
(heads x L x L) matrix is ever formed.  When every valid row is calibrated
(``queries="all"``, mean pooling), the layer runs the fused per-basket kernel of
:mod:`posfair.calibration.fused` where it applies (CPU inference, float32 / bfloat16,
padding-only mask, not causal, no recording or dropout), on CUDA the per-basket path of
:mod:`posfair.calibration.cuda_rows` under the same conditions; otherwise, and when every
row is recorded, the layer is computed explicitly in tiles of query rows
(:func:`explicit_attention`) so memory stays bounded by :data:`TILE_BYTES`.  ``explicit_attention(naive=True)`` is the full-matrix path:
the slow reference and the benchmark's "naive" baseline.

Scores and probabilities of the explicit paths are computed in float32 whatever the model's
dtype: for a bfloat16 / float16 model only the explicit rows' scores and probabilities are
float32 (the keys are upcast a block of :data:`KEY_BLOCK_BYTES` at a time, never a whole
layer's activations), and the product with the values runs in the model's dtype.  The fused
path runs in the model's dtype, see its module.

Training (a model fine-tuned with a default calibration): the explicit paths are
differentiable (probabilities about to be calibrated in place are copied first when
autograd tracks them), and attention dropout ``dropout`` (what the stock kernel gets in
training mode) is applied to the calibrated probabilities, after any recording, as
eager attention applies it after the softmax.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from posfair.calibration import cuda_rows, fused
from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.state import ForwardState

__all__ = ["TILE_BYTES", "attend", "check_supported", "explicit_attention", "pool_row_attention"]

TILE_BYTES = 32 * 2**20  # budget for one tile of explicit scores in the all-rows path
KEY_BLOCK_BYTES = 4 * 2**20  # low precision: keys are upcast to float32 in blocks of this size


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


def check_supported(kwargs: dict) -> None:
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
    qf = q.float() * scaling
    if key.dtype == torch.float32:
        scores = torch.matmul(qf, key.transpose(-1, -2).unsqueeze(2))
    else:
        # low precision: the keys are upcast a block at a time (never the whole layer's keys at once);
        # only these rows' scores and probabilities are float32
        B, Hkv, K, D = key.shape
        step = max(1, KEY_BLOCK_BYTES // max(1, B * Hkv * D * 4))
        blocks = range(0, K, step)
        if torch.is_grad_enabled() and (q.requires_grad or key.requires_grad):  # out= is not differentiable
            scores = torch.cat(
                [torch.matmul(qf, key[:, :, k0 : k0 + step].float().transpose(-1, -2).unsqueeze(2)) for k0 in blocks],
                -1,
            )
        else:
            scores = torch.empty(*qf.shape[:-1], K, dtype=torch.float32, device=q.device)
            for k0 in blocks:
                torch.matmul(
                    qf,
                    key[:, :, k0 : k0 + step].float().transpose(-1, -2).unsqueeze(2),
                    out=scores[..., k0 : k0 + step],
                )
    if mask_rows is not None:
        scores.add_(mask_rows)
    return torch.softmax(scores, dim=-1)


def _mask_for_rows(
    attention_mask: torch.Tensor | None, rows: torch.Tensor, heads: int, kv_heads: int
) -> torch.Tensor | None:
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


def _mask_for_tile(
    attention_mask: torch.Tensor | None, t0: int, t1: int, heads: int, kv_heads: int, B: int
) -> torch.Tensor | None:
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
    dropout: float = 0.0,
) -> torch.Tensor:
    """The pooling token's attention output (B, H, D), calibrated if asked; records the row."""
    B, H, L, D = query.shape
    kv_heads, groups = _grouped(query, key)
    rows = state.pool_rows().to(query.device)
    q = query[torch.arange(B, device=query.device), :, rows].view(B, kv_heads, groups, 1, D)
    mask = _mask_for_rows(attention_mask, rows, H, kv_heads)
    if mask is None and _is_causal(module, kwargs) and L > 1:
        K = key.shape[2]
        causal = torch.where(
            torch.arange(K, device=query.device)[None, :] <= rows[:, None], 0.0, torch.finfo(torch.float32).min
        )
        mask = causal[:, None, None, None, :]
    probs = _explicit_probs(q, key, mask, scaling)  # (B, Hkv, g, 1, K)
    if calibrate:
        cal = state.baskets(module.layer_idx).for_heads((kv_heads, groups, 1), probs)
        self_key = rows.view(B, 1, 1, 1) if cal.self_share is not None else None
        probs = calibrate_rows(probs, state.start.view(B, 1, 1, 1), state.end.view(B, 1, 1, 1), cal, self_key=self_key)
    if record:
        state.recorder(module.layer_idx, probs.reshape(B, H, -1))
    if dropout:
        probs = F.dropout(probs, p=dropout, training=True)
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
    dropout: float = 0.0,
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
    start = end = None
    if state is not None:
        start = state.start.view(B, 1, 1, 1).to(query.device)
        end = state.end.view(B, 1, 1, 1).to(query.device)
    cal = _layer_settings(state, module, calibrate_rows_mode, kv_heads, groups, query)
    for t0 in range(0, L, tile_rows):
        t1 = min(L, t0 + tile_rows)
        mask = _mask_for_tile(attention_mask, t0, t1, H, kv_heads, B)
        if causal:
            c = _causal_additive(t0, t1, K, query.device)
            mask = c if mask is None else mask + c
        probs = _explicit_probs(q_all[:, :, :, t0:t1], key, mask, scaling)  # (B, Hkv, g, T, K)
        probs = _calibrate_tile(probs, cal, state, calibrate_rows_mode, naive, start, end, t0, t1)
        if rec_sum is not None:
            _record_tile(rec_sum, probs, state, start, end, t0, t1)
        if dropout:
            probs = F.dropout(probs, p=dropout, training=True)
        o = torch.matmul(probs.to(value.dtype), value.unsqueeze(2))  # (B, Hkv, g, T, D)
        out[:, t0:t1] = o.reshape(B, H, t1 - t0, D).transpose(1, 2)
    if rec_sum is not None:
        if state.record_queries == "all":
            n = (state.end - state.start + 1).to(rec_sum.device).float().view(B, 1, 1)
            rec_sum = rec_sum / n
        state.recorder(module.layer_idx, rec_sum)
    return out


def _layer_settings(state, module, mode: str | None, kv_heads: int, groups: int, query: torch.Tensor):
    """The layer's :class:`~posfair.calibration.resolved.BasketSettings` as :func:`_calibrate_tile` takes it, built
    once for all tiles: per-head strengths laid out as the tile's rows (B, Hkv, g, T) have them (the pooling row's
    (B, Hkv, g) with ``mode="pool"``); None where no row is calibrated."""
    if mode is None or state is None:
        return None
    like = torch.empty(0, dtype=torch.float32, device=query.device)  # the explicit probabilities' dtype
    shape = (kv_heads, groups) if mode == "pool" else (kv_heads, groups, 1)
    return state.baskets(module.layer_idx).for_heads(shape, like)


def _calibrate_tile(probs, cal, state, mode: str | None, naive: bool, start, end, t0: int, t1: int) -> torch.Tensor:
    """The probabilities (B, Hkv, g, T, K) of query rows ``t0:t1`` with the rows ``mode`` names calibrated ("all":
    every valid row, "pool": the pooling row, None: none) by ``cal`` (:func:`_layer_settings`); ``start`` / ``end``:
    each sequence's span (B, 1, 1, 1)."""
    B = probs.shape[0]
    if mode is not None and probs.requires_grad:
        probs = probs.clone()  # calibrated in place below; softmax's backward needs its own output
    if mode == "all" and not naive:
        # fast path: every row of a sequence shares its span; padding query rows are calibrated
        # too, which is harmless (their outputs only reach masked keys and are never pooled)
        for b, (s_b, e_b) in enumerate(zip(state.start.tolist(), state.end.tolist(), strict=True)):
            calibrate_span_(probs[b], s_b, e_b, cal, row_offset=t0)
    elif mode == "pool" and state is not None:
        # only the pooling row is calibrated (what a hook on eager weights does)
        pool = state.pool_rows().to(probs.device)
        inside = (pool >= t0) & (pool < t1)
        if bool(inside.any()):
            b_idx = torch.arange(B, device=probs.device)
            r_idx = (pool - t0).clamp(0, t1 - t0 - 1)
            row = probs[b_idx, :, :, r_idx]  # (B, Hkv, g, K)
            self_key = pool.view(B, 1, 1) if cal.self_share is not None else None
            done = calibrate_rows(row, start.view(B, 1, 1), end.view(B, 1, 1), cal, self_key=self_key)
            probs[b_idx, :, :, r_idx] = torch.where(inside.view(B, 1, 1, 1), done, row)
    elif mode == "all" and state is not None:
        rows = torch.arange(t0, t1, device=probs.device).view(1, 1, 1, -1)
        self_key = rows if cal.self_share is not None else None
        done = calibrate_rows(probs, start, end, cal, self_key=self_key)
        probs = torch.where(((rows >= start) & (rows <= end)).unsqueeze(-1), done, probs)
    return probs


def _record_tile(rec_sum: torch.Tensor, probs: torch.Tensor, state, start, end, t0: int, t1: int) -> None:
    """Add the recorded rows of tile ``t0:t1`` to ``rec_sum`` (B, H, K), in place: every valid row's probabilities
    (``record_queries="all"``, averaged at the end) or the pooling row's."""
    B, H, K = rec_sum.shape
    if state.record_queries == "all":
        rows = torch.arange(t0, t1, device=probs.device).view(1, 1, 1, -1)
        valid = ((rows >= start) & (rows <= end)).unsqueeze(-1).float()
        rec_sum += (probs * valid).sum(dim=3).reshape(B, H, K)
    else:
        pool = state.pool_rows().to(probs.device)
        inside = (pool >= t0) & (pool < t1)
        if bool(inside.any()):
            idx = (pool - t0).clamp(0, t1 - t0 - 1)
            picked = probs[torch.arange(B, device=probs.device), :, :, idx]  # (B, Hkv, g, K)
            rec_sum += picked.reshape(B, H, K) * inside.view(B, 1, 1).float()


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
    dropout: float = 0.0,
) -> torch.Tensor:
    """The attention output (B, L, H, D) of a calibrated and/or recorded layer.

    ``stock()`` runs the stock kernel for all rows (returning (B, L, H, D)); the pooling
    row is then recomputed explicitly and written in.  When every valid row is calibrated
    (``queries="all"``) or recorded, the layer is computed explicitly in tiles instead.
    Shared by the registry function and the fallback's intercepted SDPA call.
    ``dropout``: the attention dropout probability the stock kernel was given (0 outside training).
    """
    check_supported(kwargs)
    if calibrate and state.calibration.queries == "all":
        if (
            fused.ENABLED
            and fused.temperature_only(state, module.layer_idx)
            and fused.exact(module, query, key, value, attention_mask, state, record, kwargs, dropout)
        ):
            return fused.tempered_attention(query, key, value, attention_mask, scaling, state, layer=module.layer_idx)
        if fused.applicable(module, query, key, value, attention_mask, state, record, kwargs, dropout):
            return fused.basket_attention(query, key, value, scaling, state, layer=module.layer_idx)
        if cuda_rows.applicable(module, query, key, value, attention_mask, state, record, kwargs, dropout):
            return cuda_rows.basket_attention(query, key, value, scaling, state, layer=module.layer_idx)
        return explicit_attention(
            module, query, key, value, attention_mask, scaling, state, "all", record, kwargs, dropout=dropout
        )
    if record and state.record_queries == "all":
        # profile of a mean-pooled model: tiled explicit pass, output identical up to float rounding
        mode = "pool" if calibrate else None
        return explicit_attention(
            module, query, key, value, attention_mask, scaling, state, mode, record, kwargs, dropout=dropout
        )
    out = stock()
    rows = state.pool_rows().to(out.device)
    row_out = pool_row_attention(
        module, query, key, value, attention_mask, scaling, state, calibrate, record, kwargs, dropout
    )
    B = out.shape[0]
    index = (torch.arange(B, device=out.device), rows)
    if torch.is_grad_enabled() and (out.requires_grad or row_out.requires_grad):
        return out.index_put(index, row_out.to(out.dtype))  # autograd: the stock kernel's backward may need its output
    return out.index_put_(index, row_out.to(out.dtype))  # inference: written in place, no copy of the layer's output
