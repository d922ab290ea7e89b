"""The basket formula: one pure function over post-softmax attention rows.

Given an attention row ``a`` over keys ``0..K-1`` whose valid keys form the
contiguous span ``[start, end]`` (padding keys carry 0), calibration

1. isolates the BOS key at ``start`` (``isolate_bos``) and the EOS key at ``end``
   (``isolate_eos``);
2. cuts the remaining *content* keys (``C`` of them) into consecutive baskets of
   ``basket_size`` keys, starting at the first content key (the last basket may
   be shorter): ``n_b = ceil(C / B)`` baskets, ``n_total = n_b + #isolated``;
3. gives every isolated key its share: ``"equal"`` -> ``1 / n_total``,
   ``"original"`` -> the mass the row gave it, or a fixed float;
4. rescales every content basket to the same total mass
   ``(1 - sum(isolated shares)) / n_b`` keeping the proportions inside the basket
   (a basket whose mass is 0 stays 0). With all shares ``"equal"`` this is
   ``1 / n_total`` per basket, the papers' formulation;
5. renormalises the row to sum 1 and blends with the original:
   ``strength * calibrated + (1 - strength) * a``.

Rows whose content is shorter than one basket (``C < B``) are returned
unchanged, as the authors' implementation encodes such texts uncalibrated.

The function is vectorised over any leading dimensions (batch, heads, query
rows) and is independent of torch's autograd state and of any model.
"""

from __future__ import annotations

import torch

from posfair.calibration.params import Share

__all__ = ["basket_weights", "calibrate_rows", "calibrate_span_"]


def _share(weight: Share, original: torch.Tensor, n_total: torch.Tensor) -> torch.Tensor:
    if weight == "equal":
        return 1.0 / n_total
    if weight == "original":
        return original
    return torch.full_like(original, float(weight))


def calibrate_rows(
    weights: torch.Tensor,
    start: torch.Tensor | int,
    end: torch.Tensor | int,
    *,
    basket_size: int,
    strength: float = 1.0,
    isolate_bos: bool = False,
    isolate_eos: bool = False,
    bos_weight: Share = "original",
    eos_weight: Share = "equal",
) -> torch.Tensor:
    """Calibrate attention rows.

    Args:
        weights: post-softmax attention, shape ``(..., K)``.
        start, end: first / last valid key index of each row (inclusive),
            broadcastable to ``weights.shape[:-1]``.
        basket_size, strength, isolate_bos, isolate_eos, bos_weight, eos_weight:
            see the module docstring and :class:`posfair.Calibration`.

    Returns:
        A tensor of the shape of ``weights`` (float64 stays float64; lower precisions are computed in float32).
    """
    if basket_size < 1:
        raise ValueError(f"basket_size must be >= 1; got {basket_size}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be in [0, 1]; got {strength}")
    a = weights if weights.dtype in (torch.float32, torch.float64) else weights.float()
    lead, K = a.shape[:-1], a.shape[-1]
    dev = a.device
    start = torch.as_tensor(start, device=dev).long().expand(lead).unsqueeze(-1)
    end = torch.as_tensor(end, device=dev).long().expand(lead).unsqueeze(-1)
    B = int(basket_size)

    keys = torch.arange(K, device=dev)
    c_start = start + int(isolate_bos)
    c_end = end - int(isolate_eos)
    n_content = c_end - c_start + 1  # (..., 1)
    active = n_content >= B  # rows to calibrate

    content = (keys >= c_start) & (keys <= c_end)
    n_slots = (K + B - 1) // B + 1  # content baskets + one slot for everything else
    basket = torch.where(content, torch.div(keys - c_start, B, rounding_mode="floor"), n_slots - 1)
    basket = basket.clamp(0, n_slots - 1)
    mass = torch.zeros((*lead, n_slots), device=dev, dtype=a.dtype)
    mass.scatter_add_(-1, basket, torch.where(content, a, torch.zeros((), device=dev)))

    n_baskets = torch.div(n_content.clamp(min=1) + B - 1, B, rounding_mode="floor").to(a.dtype)
    n_total = n_baskets + int(isolate_bos) + int(isolate_eos)

    iso_total = torch.zeros_like(n_baskets)
    bos_share = eos_share = None
    if isolate_bos:
        bos_share = _share(bos_weight, a.gather(-1, start.clamp(0, K - 1)), n_total)
        iso_total = iso_total + bos_share
    if isolate_eos:
        eos_share = _share(eos_weight, a.gather(-1, end.clamp(0, K - 1)), n_total)
        iso_total = iso_total + eos_share

    per_basket = ((1.0 - iso_total) / n_baskets).clamp(min=0.0)  # target mass of each content basket
    factor = torch.where(mass > 0, per_basket / mass.clamp(min=torch.finfo(a.dtype).tiny), torch.zeros((), device=dev))
    factor[..., n_slots - 1] = 0.0
    cal = a * factor.gather(-1, basket)
    if bos_share is not None:
        cal = torch.where(keys == start, bos_share, cal)
    if eos_share is not None:
        cal = torch.where(keys == end, eos_share, cal)

    total = cal.sum(-1, keepdim=True)
    cal = torch.where(total > 0, cal / total.clamp(min=torch.finfo(a.dtype).tiny), a)
    out = strength * cal + (1.0 - strength) * a
    return torch.where(active, out, a)


def calibrate_span_(
    probs: torch.Tensor,
    start: int,
    end: int,
    *,
    basket_size: int,
    strength: float = 1.0,
    isolate_bos: bool = False,
    isolate_eos: bool = False,
    bos_weight: Share = "original",
    eos_weight: Share = "equal",
) -> torch.Tensor:
    """:func:`calibrate_rows` in place, for many rows that share one valid span ``[start, end]``.

    The same formula, computed with two passes over the rows instead of a
    scatter: baskets are a reshape of the content slice, and renormalisation
    and the strength blend fold into one multiplier per basket.  Used for
    ``queries="all"``, where every row of a sequence is calibrated.
    """
    B = int(basket_size)
    c_start = start + int(isolate_bos)
    c_end = end - int(isolate_eos)
    C = c_end - c_start + 1
    if C < B:
        return probs
    n_full, tail = divmod(C, B)
    n_baskets = n_full + (1 if tail else 0)
    n_total = n_baskets + int(isolate_bos) + int(isolate_eos)
    content = probs[..., c_start : c_end + 1]
    body = content[..., : n_full * B].unflatten(-1, (n_full, B))
    mass = body.sum(-1)
    if tail:
        mass = torch.cat([mass, content[..., n_full * B :].sum(-1, keepdim=True)], dim=-1)

    lead = probs.shape[:-1]
    iso = []  # (key, share, original value)
    for flag, key, weight in ((isolate_bos, start, bos_weight), (isolate_eos, end, eos_weight)):
        if flag:
            orig = probs[..., key].clone()
            share = (
                orig
                if weight == "original"
                else torch.full(lead, 1.0 / n_total if weight == "equal" else float(weight), dtype=probs.dtype, device=probs.device)
            )
            iso.append((key, share, orig))
    iso_total = sum((s for _, s, _ in iso), torch.zeros(lead, dtype=probs.dtype, device=probs.device))
    per = ((1.0 - iso_total) / n_baskets).clamp(min=0.0).unsqueeze(-1)  # target mass of each content basket
    nonzero = mass > 0
    factor = torch.where(
        nonzero, per / mass.clamp(min=torch.finfo(probs.dtype).tiny), torch.zeros((), dtype=probs.dtype, device=probs.device)
    )
    total = (per * nonzero).sum(-1) + iso_total  # the calibrated row's sum, before renormalisation
    ok = total > 0
    inv = torch.where(ok, 1.0 / total.clamp(min=torch.finfo(probs.dtype).tiny), torch.zeros((), dtype=probs.dtype, device=probs.device))
    mult = torch.where(
        ok.unsqueeze(-1), strength * factor * inv.unsqueeze(-1) + (1.0 - strength), torch.ones((), dtype=probs.dtype, device=probs.device)
    )
    body.mul_(mult[..., :n_full].unsqueeze(-1))
    if tail:
        content[..., n_full * B :].mul_(mult[..., n_full:])
    for key, share, orig in iso:
        probs[..., key] = torch.where(ok, strength * share * inv + (1.0 - strength) * orig, orig)
    return probs


def basket_weights(
    mass: torch.Tensor,
    n_baskets: torch.Tensor | int,
    bos: torch.Tensor | None = None,
    eos: torch.Tensor | None = None,
    *,
    strength: float = 1.0,
    bos_weight: Share = "original",
    eos_weight: Share = "equal",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The basket formula on masses: what each basket and isolated key weighs after calibration.

    A calibrated row keeps the proportions inside each content basket, so it is fully
    described by one mass per basket and one per isolated key.  Given the original row's
    masses -- ``mass`` (..., n) per content basket (0 for slots beyond the row's
    ``n_baskets`` baskets), ``bos`` / ``eos`` (...) the isolated keys' probabilities (None
    when the key is not isolated) -- returns ``(w, bos_value, eos_value)``: the calibrated
    row is ``sum_b w_b * (row restricted to basket b, renormalised) + bos_value * e_bos +
    eos_value * e_eos``, exactly what :func:`calibrate_span_` produces (renormalisation
    and the strength blend included; a basket of mass 0 stays 0).  The caller decides
    whether the row is calibrated at all (``C >= basket_size``); this function assumes it is.
    """
    n_b = torch.as_tensor(n_baskets, dtype=mass.dtype, device=mass.device).expand(mass.shape[:-1])
    n_total = n_b + int(bos is not None) + int(eos is not None)
    zero = torch.zeros((), dtype=mass.dtype, device=mass.device)
    shares = []
    for orig, weight in ((bos, bos_weight), (eos, eos_weight)):
        if orig is not None:
            shares.append(_share(weight, orig, n_total))
    iso_total = sum(shares, torch.zeros_like(n_b))
    per = ((1.0 - iso_total) / n_b.clamp(min=1)).clamp(min=0.0)  # target mass of each content basket
    nonzero = mass > 0
    total = per * nonzero.sum(-1).to(mass.dtype) + iso_total  # the calibrated row's sum before renormalisation
    ok = total > 0
    inv = torch.where(ok, 1.0 / total.clamp(min=torch.finfo(mass.dtype).tiny), zero)
    w = torch.where(ok.unsqueeze(-1), strength * (per * inv).unsqueeze(-1) * nonzero + (1.0 - strength) * mass, mass)
    values = []
    for orig, share in zip((o for o in (bos, eos) if o is not None), shares, strict=True):
        values.append(torch.where(ok, strength * share * inv + (1.0 - strength) * orig, orig))
    it = iter(values)
    return w, next(it) if bos is not None else None, next(it) if eos is not None else None
