"""All-rows calibration in one fused pass: attention per basket, combined by the basket formula.

A calibrated row keeps the proportions inside each content basket of keys, so with
``O_b`` the attention output restricted to basket ``b`` (softmax over that basket's keys
only) and ``m_b`` the row's original mass on it, the calibrated output is

    out = sum_b w_b * O_b + bos_value * v_bos + eos_value * v_eos

where ``w_b`` and the isolated keys' values come from the masses alone
(:func:`~posfair.calibration.baskets.basket_weights`; the positional-prior variant's
density at each basket's centre enters there too).  ``O_b`` and the per-basket
log-sum-exps ``lse_b`` (hence ``m_b = exp(lse_b - logsumexp_b' lse_b')``) are what CPU
flash attention (``aten._scaled_dot_product_flash_attention_for_cpu``) returns when the
baskets are laid out as a head dimension: keys and values are gathered so that each
sequence's content keys start at basket 0 (any padding / BOS offset), the query block is
*expanded* (a view, no copy) across baskets, and one call computes every basket of a block
of (sequence, head) pairs x query rows.  The work is that of one stock SDPA call (same
FLOPs, no L x K matrix in memory); the extra cost is writing ``n_baskets`` partial outputs
per query row and head, and their weighted sum.  Blocks are sized (:func:`_blocks`) so one
call's partial outputs take about :data:`FUSED_TILE_BYTES`: they stay in the last-level
cache for the weighted sum, and below glibc's mmap threshold, so they are not mapped and
page-faulted afresh on every call (``benchmarks/fused_blocks.py`` measures both).

Used by :func:`~posfair.calibration.kernels.attend` for ``queries="all"`` when
:func:`applicable` holds (CPU, float32 / bfloat16, inference, no dropout, no recording,
a padding-only mask, not causal, no self-attention share); otherwise the tiled explicit
path runs.  Computed in the model's dtype; only the per-basket masses and the weighted sum
are float32.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from posfair.calibration.baskets import basket_centres, basket_weights, prior_at
from posfair.calibration.resolved import BasketSettings
from posfair.calibration.rule import basket_count, engine_calibrates
from posfair.calibration.state import ForwardState

__all__ = ["ENABLED", "FUSED_GROUP_BYTES", "FUSED_TILE_BYTES", "Pairs", "applicable", "basket_attention", "exact"]

ENABLED = True  # off: queries="all" always takes the tiled explicit path (the benchmark's "tiled-all")
FUSED_TILE_BYTES = (
    8 * 2**20
)  # budget for one flash call's per-basket outputs (float32): fits the cache, under glibc's mmap threshold
#: budget for grouping (sequence, head) pairs into one flash call (:func:`_blocks`): one pair may use FUSED_TILE_BYTES,
#: but the weighted sum of a group's outputs leaves the cache past about 4 MB (issue 50, one layer at 2,048 tokens,
#: one thread: two pairs a call, 8 MB, 18 ms a layer in :meth:`Pairs.combine`; one pair, 4 MB, 5 ms)
FUSED_GROUP_BYTES = 4 * 2**20
MIN_TILE_ROWS = 768
_DTYPES = (torch.float32, torch.bfloat16)


def _padding_only(mask: torch.Tensor | None, start: torch.Tensor, end: torch.Tensor, K: int) -> bool:
    """Whether ``mask`` (B|1, 1|H, L|1, K), boolean or additive, only masks the keys outside each span."""
    if mask is None:
        return bool((start == 0).all() and (end == K - 1).all())
    m = mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.shape[-1] != K:
        return False
    for dim in (1, 2):  # broadcast (stride-0) dimensions are checked once
        if m.shape[dim] > 1 and m.stride(dim) == 0:
            m = m.narrow(dim, 0, 1)
    keys = torch.arange(K, device=m.device)
    inside = ((keys >= start.to(m.device)[:, None]) & (keys <= end.to(m.device)[:, None]))[:, None, None, :]
    if m.shape[0] not in (1, inside.shape[0]):
        return False
    if m.dtype == torch.bool:
        return bool((m == inside).all())
    return bool(torch.where(inside, m == 0, m <= torch.finfo(m.dtype).min / 2).all())


def applicable(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    state: ForwardState,
    record: bool,
    kwargs: dict,
    dropout: float,
) -> bool:
    """Whether the fused path computes this layer (else the CUDA path of :mod:`posfair.calibration.cuda_rows`
    or the tiled explicit path does)."""
    if not ENABLED or query.device.type != "cpu" or query.dtype not in _DTYPES:
        return False
    return exact(module, query, key, value, attention_mask, state, record, kwargs, dropout)


def exact(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    state: ForwardState,
    record: bool,
    kwargs: dict,
    dropout: float,
) -> bool:
    """Whether a per-basket path computes this layer exactly, whatever the device: inference, no dropout, no
    recording, no self-attention share, not causal, one dtype, a padding-only mask."""
    if record or dropout:
        return False
    if torch.is_grad_enabled() and state.calibration.differentiable:
        return False  # a fit: strengths autograd tracks go through the explicit path
    if state.calibration.self_share is not None:
        return False  # the own key's share would be a cancelling difference of basket outputs: the tiled path is exact
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False  # training: the explicit path is differentiable end to end
    flag = kwargs.get("is_causal")
    if (flag if flag is not None else getattr(module, "is_causal", False)) and query.shape[2] > 1:
        return False
    if query.shape[2] != key.shape[2]:
        return False
    return _padding_only(attention_mask, state.start, state.end, key.shape[2])


def temperature_only(state: ForwardState, layer: int | None) -> bool:
    """Whether the layer runs TempScale alone (a temperature, strength 0, no per-head strengths): then
    :func:`tempered_attention` computes it with one stock SDPA call."""
    cal = state.baskets(layer)
    return cal.temperature is not None and cal.head_strength is None and float(cal.strength) == 0.0


def tempered_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    state: ForwardState,
    layer: int | None = None,
) -> torch.Tensor:
    """TempScale alone, every row (``queries="all"``; where :func:`exact` holds): stock SDPA with the queries of the
    sequences the formula runs on (content of at least one basket) divided by T; returns (B, L, H, D)."""
    cal = state.baskets(layer)
    C = (state.end - state.start + 1 - int(cal.isolate_bos) - int(cal.isolate_eos)).to(query.device)
    factor = torch.where(engine_calibrates(C, cal.basket_size), 1.0 / float(cal.temperature), 1.0)
    q = query * factor.to(query.dtype).view(-1, 1, 1, 1)
    if key.shape[1] != query.shape[1]:  # grouped-query attention
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.transpose(1, 2)


def basket_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    state: ForwardState,
    tile_rows: int | None = None,
    heads_per_call: int | None = None,
    layer: int | None = None,
) -> torch.Tensor:
    """Every row calibrated (``queries="all"``), fused; returns (B, L, H, D) in the value's dtype.

    Padding query rows are calibrated too, which is harmless: their outputs only reach
    padding positions, never pooled (as in the tiled explicit path).  ``layer``: the layer's
    0-based index (a per-layer positional prior); ``tile_rows`` / ``heads_per_call``: the
    blocking of :func:`_blocks`, chosen automatically when None.
    """
    p = Pairs(query, key, value, state, layer)  # the shapes checked, the baskets laid out
    query = p.tempered(query)
    keys, values = _per_basket(key, p), _per_basket(value, p)
    rows, group = _blocks(p.B * p.H, p.L, p.nb * p.D * 4, tile_rows, heads_per_call)
    out = torch.empty(p.B, p.L, p.H, p.D, dtype=value.dtype, device=p.dev)  # the layout returned: no copy at the end
    for g0, g1, t0, t1, o, lse, qt in _basket_outputs(query, keys, values, _slot_mask(p), scaling, rows, group):
        _write_rows(out.transpose(1, 2), p.combine(o, lse, qt, scaling, g0, g1), g0, g1, t0, t1)
    return out


def _write_rows(heads: torch.Tensor, acc: torch.Tensor, g0: int, g1: int, t0: int, t1: int) -> None:
    """Rows ``t0:t1`` of (sequence, head) pairs ``g0:g1`` (``acc``: (G, T, D)) into ``heads`` (B, H, L, D), a view of
    the (B, L, H, D) output, one sequence's heads at a time."""
    H = heads.shape[1]
    for b in range(g0 // H, (g1 - 1) // H + 1):
        lo, hi = max(g0, b * H), min(g1, (b + 1) * H)
        heads[b, lo - b * H : hi - b * H, t0:t1] = acc[lo - g0 : hi - g0]


def _per_basket(x: torch.Tensor, p: Pairs) -> torch.Tensor:
    """Keys or values (B, Hkv, K, D) laid out per basket, (B*H, nb, Bs, D): basket j of every sequence is its
    content keys ``j*Bs .. (j+1)*Bs - 1`` (slots past the content hold any key; :func:`_slot_mask` masks them)."""
    B, kv_heads, g, S, D = p.B, p.kv_heads, p.g, p.S, p.D
    c0 = int(p.c_start[0])
    if bool((p.c_start == c0).all()):  # batch 1, right padding: a slice, not a gather
        got = x[:, :, c0 : c0 + S]
        if got.shape[2] < S:  # the last basket runs past the keys: masked slots
            got = torch.cat([got, got.new_zeros(B, kv_heads, S - got.shape[2], D)], dim=2)
    else:
        idx = (p.c_start[:, None] + torch.arange(S, device=p.dev)[None, :]).clamp(max=p.K - 1)
        got = x.gather(2, idx[:, None, :, None].expand(B, kv_heads, S, D))
    return got[:, :, None].expand(B, kv_heads, g, S, D).reshape(B * p.H, p.nb, p.Bs, D)


def _slot_mask(p: Pairs) -> torch.Tensor | None:
    """The additive mask (B*H, nb, 1, Bs) of the slots past each sequence's content; None when every slot holds one."""
    if bool(p.valid.all()):
        return None
    add = torch.where(p.valid, torch.zeros((), dtype=p.dt, device=p.dev), torch.finfo(p.dt).min)
    return add.view(p.B, 1, p.nb, 1, p.Bs).expand(p.B, p.H, p.nb, 1, p.Bs).reshape(p.B * p.H, p.nb, 1, p.Bs)


def _basket_outputs(query, keys, values, mask, scaling: float, rows: int, group: int):
    """Per block of ``group`` (sequence, head) pairs x ``rows`` query rows, CPU flash attention's per-basket
    outputs: yields ``(g0, g1, t0, t1, o, lse, qt)`` with ``o`` (G, nb, T, D), ``lse`` (G, nb, T) and the block's
    queries ``qt`` (G, T, D) -- the baskets laid out as a head dimension, the queries expanded across them."""
    B, H, L, D = query.shape
    nb = keys.shape[1]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    qf = query.reshape(B * H, L, D)
    for g0 in range(0, B * H, group):
        g1 = min(B * H, g0 + group)
        for t0 in range(0, L, rows):
            t1 = min(L, t0 + rows)
            qt = qf[g0:g1, t0:t1]
            o, lse = flash(
                qt.unsqueeze(1).expand(g1 - g0, nb, t1 - t0, D),
                keys[g0:g1],
                values[g0:g1],
                attn_mask=None if mask is None else mask[g0:g1],
                scale=scaling,
            )
            yield g0, g1, t0, t1, o, lse, qt


class Pairs:
    """What the per-basket paths share for one layer: the baskets' layout and, per (sequence, head) pair
    (``B * H`` of them, sequence-major), the isolated keys, whether the row is calibrated, the basket counts
    and the prior; :meth:`combine` turns one block's per-basket outputs into calibrated rows."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: ForwardState, layer):
        B, H, L, D = query.shape
        K = key.shape[2]
        kv_heads = key.shape[1]
        if H % kv_heads:
            raise ValueError(f"query heads ({H}) are not a multiple of key/value heads ({kv_heads})")
        self.settings = cal = state.baskets(layer)
        Bs = cal.basket_size
        dev = query.device
        start = state.start.to(dev).long()
        end = state.end.to(dev).long()
        self.c_start = start + int(cal.isolate_bos)
        self.C = C = (end - int(cal.isolate_eos) - self.c_start + 1).clamp(min=0)  # content keys per sequence
        self.B, self.H, self.L, self.D, self.K, self.kv_heads, self.g = B, H, L, D, K, kv_heads, H // kv_heads
        per_head = self.per_head
        self.active = per_head(engine_calibrates(C, Bs)).view(B * H, 1, 1)  # shorter than one basket: stock
        if cal.temperature is not None and cal.head_strength is None and float(cal.strength) == 0.0:
            # TempScale alone: the basket formula returns every row as it is, so the content is laid out as one
            # basket (one flash call per block, not one per basket of B keys); which rows are tempered stays B's rule
            self.settings = cal = replace(cal, trailing="basket", prior=None)
            Bs = max(1, int(C.max()))
        self.nb = nb = int(basket_count(int(C.max()), Bs))
        self.Bs, self.S, self.dev, self.dt = Bs, nb * Bs, dev, query.dtype
        self.valid = torch.arange(self.S, device=dev)[None, :] < C[:, None]  # (B, S): slots holding a content key
        self.n_b = per_head(basket_count(C, Bs).to(torch.float32)).view(B * H, 1)
        self.n_content = per_head(C).view(B * H, 1)
        self.isolated = self._isolated(key, value, start, end)
        self.strength = None  # per-head strengths, per (sequence, head) pair: (B*H,)
        self.block_settings: dict[tuple[int, int], BasketSettings] = {}  # combine()'s, per block of pairs
        if cal.head_strength is not None:
            vec = cal.for_heads((H,), torch.empty(0, dtype=torch.float32, device=dev)).strength
            self.strength = vec.repeat(B)
            self.settings = cal = replace(cal, head_strength=None)
        self.seq_active = self.active.view(B, H)[:, 0]  # (B,): the sequences the formula runs on
        self.all_active = bool(self.seq_active.all())
        self.prior = None
        if cal.prior is not None:  # the density at each sequence's basket centres: (B*H, 1, nb)
            prior = prior_at(cal.prior, basket_centres(C.view(B, 1), nb, Bs, torch.float32, cal.trailing))
            self.prior = per_head(prior).view(B * H, 1, nb)

    def _isolated(self, key: torch.Tensor, value: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> list:
        """(key vector, value vector, present) per isolated key, each (B*H, ...) float32: BOS, then EOS (absent
        where it is the BOS key)."""
        B, H, D, kv_heads, g, dev = self.B, self.H, self.D, self.kv_heads, self.g, self.dev

        def pick(pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B*H, D) float32
            picked = x[torch.arange(B, device=dev), :, pos]  # (B, Hkv, D)
            return picked[:, :, None].expand(B, kv_heads, g, D).reshape(B * H, D).float()

        iso_b, iso_e = self.settings.isolate_bos, self.settings.isolate_eos
        out = []
        if iso_b:
            out.append((pick(start, key), pick(start, value), torch.ones(B * H, dtype=torch.bool, device=dev)))
        if iso_e:
            present = ~(start == end) if iso_b else torch.ones(B, dtype=torch.bool, device=dev)
            out.append((pick(end, key), pick(end, value), self.per_head(present)))
        return out

    def tempered(self, query: torch.Tensor) -> torch.Tensor:
        """``query`` (B, H, L, D) with TempScale's temperature folded in: the queries of the sequences the formula
        runs on divided by T (``softmax(q k / T)``, the isolated keys' scores included); unchanged without one."""
        T = self.settings.temperature
        if T is None:
            return query
        factor = torch.where(self.seq_active, 1.0 / float(T), 1.0).to(query.dtype)
        return query * factor.view(-1, 1, 1, 1)

    def per_head(self, x: torch.Tensor) -> torch.Tensor:
        """(B, ...) per sequence -> (B*H, ...) per (sequence, head)."""
        B, H = self.B, self.H
        return x.unsqueeze(1).expand(B, H, *x.shape[1:]).reshape(B * H, *x.shape[1:])

    def combine(
        self, o: torch.Tensor, lse: torch.Tensor, qt: torch.Tensor, scaling: float, g0: int, g1: int
    ) -> torch.Tensor:
        """The calibrated rows (G, T, D), float32, of pairs ``g0:g1`` from their per-basket outputs ``o``
        (G, nb, T, D; overwritten) and log-sum-exps ``lse`` (G, nb, T); ``qt`` (G, T, D): their queries."""
        G = g1 - g0
        cal = self.settings
        if self.strength is not None:  # per-head strengths: one setting per block of pairs, built once for all tiles
            cal = self.block_settings.get((g0, g1))
            if cal is None:
                cal = self.block_settings[g0, g1] = replace(self.settings, strength=self.strength[g0:g1].view(G, 1))
        lse = lse.transpose(1, 2)  # (G, T, nb)
        iso_scores = []
        for kvec, _, present in self.isolated:
            s = torch.matmul(qt.float(), kvec[g0:g1].unsqueeze(-1)).squeeze(-1) * scaling  # (G, T)
            iso_scores.append(torch.where(present[g0:g1].view(G, 1), s, -torch.inf))
        mass, iso_mass = _masses(lse, iso_scores)
        w, bos_v, eos_v = basket_weights(
            mass,
            self.n_b[g0:g1],
            iso_mass[0] if cal.isolate_bos else None,
            iso_mass[-1] if cal.isolate_eos else None,
            cal,
            prior=None if self.prior is None else self.prior[g0:g1],
            n_content=self.n_content[g0:g1],
        )
        on = self.active[g0:g1]
        if not self.all_active:
            w = torch.where(on, w, mass)
        values = [v for v in (bos_v, eos_v) if v is not None]
        wb = w.transpose(1, 2).unsqueeze(-1)  # (G, nb, T, 1)
        if o.dtype != torch.float32:
            wb = wb.to(o.dtype)  # low-precision products, float32 accumulation (torch's sum of bfloat16)
        acc = o.mul_(wb).sum(1, dtype=torch.float32)  # (G, T, D): sum_b w_b O_b (measured faster than bmm / einsum)
        for (_, vvec, _), val, orig in zip(self.isolated, values, iso_mass, strict=True):
            acc += torch.where(on.view(G, 1), val, orig).unsqueeze(-1) * vvec[g0:g1].unsqueeze(1)
        return acc


def _masses(lse: torch.Tensor, iso_scores: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The row's original mass on each basket (G, T, nb) and on each isolated key (G, T each): the softmax over the
    baskets' log-sum-exps ``lse`` (G, T, nb) and the isolated keys' scores (G, T; -inf where absent).

    Five passes over the (G, T, nb) values, in place where they can be (``torch.logsumexp`` of the concatenated
    scores and then ``exp(lse - row)`` took nine, each a parallel region with two threads: issue 50, item 8)."""
    top = lse.amax(-1)
    for s in iso_scores:
        top = torch.maximum(top, s)
    mass = (lse - top.unsqueeze(-1)).exp_()
    iso = [(s - top).exp_() for s in iso_scores]
    total = mass.sum(-1)
    for e in iso:
        total += e
    inv = total.reciprocal_()
    return mass.mul_(inv.unsqueeze(-1)), [e.mul_(inv) for e in iso]


def _blocks(n_heads: int, L: int, row_bytes: int, rows: int | None, group: int | None) -> tuple[int, int]:
    """Query rows and (sequence, head) pairs per flash call, so one call's per-basket outputs stay near
    :data:`FUSED_TILE_BYTES`: ``row_bytes`` is one query row's outputs over all baskets of one head.

    Whole sequences when they fit, grouping (sequence, head) pairs while the group's outputs stay within
    :data:`FUSED_GROUP_BYTES`; else one pair at a time in tiles of at least :data:`MIN_TILE_ROWS` rows (CPU flash
    attention's larger query blocks).
    ``rows`` / ``group`` given are kept.  One layer at 8,192 tokens (12 heads of 32, 128-key
    baskets, 2 cores, ``benchmarks/fused_blocks.py``): 1 head x 1,024 rows per call costs about
    1.25x a stock SDPA call, all heads x 768 rows (75 MB of outputs, mapped afresh and
    page-faulted on every call) about 1.65x.
    """
    if rows is None:
        rows = L if L * row_bytes <= FUSED_TILE_BYTES else min(L, max(MIN_TILE_ROWS, FUSED_TILE_BYTES // row_bytes))
    if group is None:
        group = max(1, FUSED_GROUP_BYTES // max(1, rows * row_bytes))
    return max(1, min(rows, L)), max(1, min(group, n_heads))
