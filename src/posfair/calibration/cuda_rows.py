"""Every row calibrated on CUDA from kernels that already exist: per-basket outputs and log-sum-exps.

The CUDA counterpart of :mod:`posfair.calibration.fused` (same formula, same
:class:`~posfair.calibration.fused.Pairs`: ``out = sum_b w_b * O_b`` + the isolated keys, with
``w_b`` from :func:`~posfair.calibration.baskets.basket_weights`).  The per-basket outputs ``O_b``
and log-sum-exps come from one attention kernel call per block, the baskets laid out as heads: the
query block is *expanded* (a view) across baskets, each (sequence, head) pair's content keys and
values are gathered so that basket ``j`` is slots ``j*B .. (j+1)*B - 1``, and slots past a
sequence's content are masked.  Two kernels can give them (:data:`KERNEL`):

``"sdpa"`` (default)
    PyTorch's SDPA kernels through their ATen entry points, which return the log-sum-exp: the flash
    kernel (``aten._scaled_dot_product_flash_attention``) for bfloat16 / float16 blocks without a
    masked slot, else the memory-efficient kernel (``aten._scaled_dot_product_efficient_attention``,
    the masked slots as an additive bias).  No compilation.
``"flex"``
    FlexAttention (``torch.nn.attention.flex_attention``, compiled with ``torch.compile`` on CUDA; its
    eager, unfused form elsewhere), the masked slots through a ``score_mod``, ``lse`` requested.

Blocks: groups of (sequence, head) pairs x tiles of query rows, sized so one call's per-basket
outputs (and the float32 tables of masses and weights beside them) take about :func:`block_bytes`;
every group gathers its pairs' keys and values once (a copy of ``S`` keys per pair, never the
layer's whole key tensor expanded across query heads).  The output is written straight into the
(B, L, H, D) tensor transformers expects.

Everything here but the two CUDA kernel calls also runs on CPU: there the ``"sdpa"`` kernel is the CPU
flash kernel the fused path uses and ``"flex"`` is eager FlexAttention, so the CPU tests run this
path against the float64 reference.  What only CUDA runs sits behind :func:`cuda_every_row_available`,
the one switch :func:`posfair.calibration.kernels.attend` consults: true exactly on CUDA devices.
``benchmarks/gpu_check.py`` checks and times it on a GPU.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from posfair.calibration import fused
from posfair.calibration.state import ForwardState

__all__ = [
    "BLOCK_BYTES",
    "ENABLED",
    "KERNEL",
    "KERNELS",
    "applicable",
    "basket_attention",
    "block_bytes",
    "cuda_every_row_available",
]

ENABLED = True  # off: on CUDA, queries="all" takes the tiled explicit path
KERNEL = "sdpa"  # which kernel gives the per-basket outputs: "sdpa" or "flex" (module docstring)
KERNELS = ("sdpa", "flex")
BLOCK_BYTES: int | None = None  # bytes of one call's per-basket outputs; None: :func:`block_bytes` decides
MIN_BLOCK_BYTES = 32 * 2**20
MAX_BLOCK_BYTES = 512 * 2**20
TABLE_BYTES = 48  # float32 tables (masses, weights, their temporaries) per query row, head and basket
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MASKED = torch.finfo(torch.float32).min  # a masked slot's score (finite: an all-masked basket has mass 0, no NaN)


def cuda_every_row_available(device: torch.device | str) -> bool:
    """The one switch: whether this module's every-row path runs on ``device`` -- CUDA devices only
    (CPU keeps :mod:`posfair.calibration.fused`).  Tests turn it on for CPU to run the path there."""
    return ENABLED and torch.device(device).type == "cuda"


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
    """Whether this path computes the layer: the switch is on for the query's device, float32 / bfloat16 /
    float16, and the per-basket form is exact (:func:`posfair.calibration.fused.exact`)."""
    if not cuda_every_row_available(query.device) or query.dtype not in _DTYPES:
        return False
    return fused.exact(module, query, key, value, attention_mask, state, record, kwargs, dropout)


def block_bytes(query: torch.Tensor) -> int:
    """One call's budget: :data:`BLOCK_BYTES` if set, else the size of the layer's query tensor within
    [:data:`MIN_BLOCK_BYTES`, :data:`MAX_BLOCK_BYTES`] (the extra memory then scales with what the model's
    own activations take, which keeps the peak near the stock model's)."""
    if BLOCK_BYTES is not None:
        return int(BLOCK_BYTES)
    return int(min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, query.numel() * query.element_size())))


def basket_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    state: ForwardState,
    layer: int | None = None,
    kernel: str | None = None,
    budget: int | None = None,
    tile_rows: int | None = None,
    pairs_per_call: int | None = None,
) -> torch.Tensor:
    """Every row calibrated (``queries="all"``); returns (B, L, H, D) in the value's dtype.

    ``kernel``: "sdpa" or "flex" (default :data:`KERNEL`); ``budget``: bytes per call (default
    :func:`block_bytes`); ``tile_rows`` / ``pairs_per_call``: the blocking, chosen from the budget when None.
    Padding query rows are calibrated too (harmless: never pooled), as in the fused path.
    """
    name = kernel or KERNEL
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {name!r}")
    partials = _sdpa_partials if name == "sdpa" else _flex_partials
    p = fused.Pairs(query, key, value, state, layer)
    query = p.tempered(query)
    B, H, L, D, K, g, Bs, nb, S, dev = p.B, p.H, p.L, p.D, p.K, p.g, p.Bs, p.nb, p.S, p.dev
    row_bytes = nb * (D * query.element_size() + TABLE_BYTES)
    rows, group = _blocks(B * H, L, row_bytes, budget or block_bytes(query), tile_rows, pairs_per_call)
    short = [c < S for c in p.C.tolist()]  # per sequence: some slot is masked (one host sync per layer)
    slot = torch.arange(S, device=dev)
    pair = torch.arange(B * H, device=dev)
    seq_of, head_of = pair // H, pair % H
    out = torch.empty(B, L, H, D, dtype=value.dtype, device=dev)
    out_pairs = out.permute(0, 2, 1, 3)  # (B, H, L, D): a view, written through
    for g0 in range(0, B * H, group):
        g1 = min(B * H, g0 + group)
        G = g1 - g0
        bi, hi = seq_of[g0:g1], head_of[g0:g1]
        pos = (p.c_start[bi][:, None] + slot).clamp(max=K - 1)  # (G, S) key index of every slot
        idx = (bi[:, None], (hi // g)[:, None], pos)
        kb = key[idx].view(G, nb, Bs, D)
        vb = value[idx].view(G, nb, Bs, D)
        keep = p.valid[bi].view(G, nb, Bs) if any(short[b] for b in range(g0 // H, (g1 - 1) // H + 1)) else None
        qg = query[bi, hi]  # (G, L, D)
        for t0 in range(0, L, rows):
            t1 = min(L, t0 + rows)
            qt = qg[:, t0:t1]
            o, lse = partials(qt.unsqueeze(1).expand(G, nb, t1 - t0, D), kb, vb, keep, scaling)
            out_pairs[bi, hi, t0:t1] = p.combine(o, lse, qt, scaling, g0, g1).to(out.dtype)
    return out


def _blocks(n_pairs: int, L: int, row_bytes: int, budget: int, rows: int | None, group: int | None):
    """Query rows and (sequence, head) pairs per call: all rows of as many pairs as ``budget`` holds, else
    one pair in tiles of rows (at least 128); ``row_bytes``: one query row's outputs and tables over all
    baskets of one pair.  Given sizes are kept."""
    if rows is None:
        rows = L if L * row_bytes <= budget else max(128, budget // row_bytes)
    if group is None:
        group = max(1, budget // max(1, rows * row_bytes))
    return max(1, min(rows, L)), max(1, min(group, n_pairs))


# -- the kernels: (G, nb, T, D) queries, (G, nb, Bs, D) keys / values, keep (G, nb, Bs) or None ->
#    (per-basket outputs (G, nb, T, D), log-sum-exps (G, nb, T) float32)


def _sdpa_partials(q, k, v, keep, scale: float):
    if q.device.type == "cuda":
        return _cuda_sdpa(q, k, v, keep, scale)
    mask = None  # elsewhere (the CPU tests): CPU flash attention, as the fused path
    if keep is not None:
        mask = torch.where(keep, torch.zeros((), dtype=q.dtype, device=q.device), torch.finfo(q.dtype).min)
        mask = mask.unsqueeze(2)  # (G, nb, 1, Bs)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)


_EXPANDED_OK: dict[tuple, bool] = {}  # per (kernel, dtype): whether it takes the expanded (stride-0) query


def _cuda_sdpa(q, k, v, keep, scale: float):
    """CUDA only: the flash kernel (bfloat16 / float16, no masked slot) or the memory-efficient one."""
    T = q.shape[2]
    if keep is None and q.dtype in (torch.bfloat16, torch.float16):

        def run(qq, bias):
            res = torch.ops.aten._scaled_dot_product_flash_attention(qq, k, v, 0.0, False, False, scale=scale)
            return res[0], res[1]

        bias = None
    else:
        bias = None
        if keep is not None:
            bias = torch.where(keep, torch.zeros((), dtype=q.dtype, device=q.device), torch.finfo(q.dtype).min)
            bias = bias.unsqueeze(2).expand(*keep.shape[:2], T, keep.shape[2])  # (G, nb, T, Bs), stride 0 over T

        def run(qq, bb):
            o, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
                qq, k, v, bb, True, 0.0, False, scale=scale
            )
            return o, lse[..., :T]  # its log-sum-exps are padded to a multiple of 32 rows

    key = (keep is None and q.dtype != torch.float32, q.dtype)
    if _EXPANDED_OK.get(key, True):
        try:
            result = run(q, bias)
            _EXPANDED_OK[key] = True
            return result
        except torch.OutOfMemoryError:
            raise
        except RuntimeError:
            if _EXPANDED_OK.get(key):
                raise  # it took expanded inputs before: a real error
            _EXPANDED_OK[key] = False  # the kernel wants dense inputs: materialise them from now on
    return run(q.contiguous(), None if bias is None else bias.contiguous())


_COMPILED: dict = {}


def _flex_partials(q, k, v, keep, scale: float):
    from torch.nn.attention import flex_attention as fa

    fn = fa.flex_attention
    if q.device.type == "cuda":  # compiled once per process (the unfused eager form materialises the scores)
        fn = _COMPILED.get("flex")
        if fn is None:
            fn = _COMPILED["flex"] = torch.compile(fa.flex_attention)
    score_mod = None
    if keep is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(keep[b, h, kv_idx], score, _MASKED)

    kw = dict(score_mod=score_mod, scale=scale)
    with warnings.catch_warnings():
        # elsewhere than CUDA (the CPU tests) the eager form is what is meant
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        if hasattr(fa, "AuxRequest"):
            o, aux = fn(q, k, v, **kw, return_aux=fa.AuxRequest(lse=True))
            return o, aux.lse
        return fn(q, k, v, **kw, return_lse=True)
