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
unchanged, as the authors' implementation encodes such texts uncalibrated
(:mod:`posfair.calibration.rule` holds that rule and says which rows the formula changes).

The **trailing-basket policy** (``trailing``) says what a last content basket shorter than
``B`` gets in steps 2-4 (``"basket"``, the default, runs exactly the formula above):

* ``"merge"``: a trailing basket shorter than ``B`` joins the basket before it:
  ``n_b = max(1, floor(C / B))`` baskets, all of ``B`` keys but the last, which holds
  ``B..2B-1`` (with the positional prior the merged basket has one prior value, at its centre);
* ``"weighted"``: a basket of ``n`` keys counts as ``n / B`` baskets: step 4 gives it the mass
  ``(1 - sum(isolated shares)) * n / C`` and step 3's ``n_total`` is ``C / B + #isolated``
  (the same as ``"basket"`` when ``B`` divides ``C``).  With the positional prior (whose target
  ``m_b / p_b`` already scales with the basket's size, ``p_b`` being a density) only
  ``n_total`` changes.

Kernels cut the content into *slots* of ``B`` keys (the last may be shorter) whatever the
policy; :func:`basket_weights` is where slots become baskets, so the policy lives there.

Two variants change steps 3-4 (both off by default; a default setting runs exactly
the formula above):

* **positional prior** (``prior``: a vector of ``R`` positive densities over relative
  content position): step 4 gives content basket ``b`` the mass
  ``m_b / p_b``, scaled so the content baskets together get
  ``1 - sum(isolated shares)``, where ``m_b`` is the row's mass on the basket and
  ``p_b`` the prior at the basket's centre (:func:`prior_at`).  A flat prior leaves
  the content as it is (up to the isolated shares); the papers' equal mass per basket
  is the special case ``p_b = m_b``.  The row's own variation survives; the average
  tilt the prior measures does not.
* **self-attention share** (``self_share`` = rho in [0, 1], with ``self_key``, the
  index of each row's own key): the own key keeps ``rho * a[self]``; the rest of the
  row is calibrated with the own key's mass set to 0 (its basket keeps the other
  keys' proportions; an isolated own key's share is dropped), renormalised and scaled
  to ``1 - rho * a[self]``.  If nothing else carries mass, the row is renormalised to
  sum 1 (rho = 0 and a row all on itself is left unchanged).  Then the strength blend
  as in step 5.  Rows whose own key is outside the valid span (padding query rows)
  get the plain formula.

:func:`basket_weights` is the formula on per-basket masses (what each basket and isolated key
weighs afterwards); :func:`calibrate_rows` (whole rows), :func:`calibrate_span_` (in place, many
rows of one span) and the fused kernel (:mod:`posfair.calibration.fused`) all call it, and all
decide whether a row is calibrated with :func:`posfair.calibration.rule.engine_calibrates` and count
baskets with :func:`posfair.calibration.rule.basket_count`.

Two settings act around the formula (both off by default):

* **per-head strengths** (``head_strength`` in :class:`~posfair.calibration.params.BasketSettings`): the blend of
  step 5 with one strength per attention head.  The basket functions take them as ``strength``, a tensor
  broadcastable to the rows' leading dimensions (:meth:`BasketSettings.for_heads
  <posfair.calibration.resolved.BasketSettings.for_heads>` lays the heads out as each kernel's rows have them);
  a setting whose ``head_strength`` is not laid out so is refused.
* **TempScale** (``temperature`` T): before step 1, a row the formula runs on becomes ``softmax(logits / T)``
  (:func:`temper_rows`: ``a ** (1 / T)`` renormalised, the same row); the formula then runs on it and blends with
  it; at strength 0 the tempered row is returned.  The per-basket kernels divide the queries by T instead
  (:mod:`posfair.calibration.fused`).

Every function takes the settings as one value, a :class:`~posfair.calibration.params.BasketSettings`
(:meth:`ResolvedCalibration.baskets <posfair.calibration.params.ResolvedCalibration.baskets>` builds it
for a layer, once per forward pass; ``calibrate_rows(w, 0, 4, BasketSettings(basket_size=2, strength=0.5))``
by hand), and nothing else: loose keyword fields are a TypeError.

The function is vectorised over any leading dimensions (batch, heads, query
rows) and is independent of torch's autograd state and of any model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from posfair.calibration.params import BasketSettings, Share
from posfair.calibration.rule import basket_count, engine_calibrates

__all__ = ["basket_centres", "basket_weights", "calibrate_rows", "calibrate_span_", "prior_at", "temper_rows"]


def prior_at(density: torch.Tensor | Sequence[float], positions: torch.Tensor) -> torch.Tensor:
    """The prior ``density`` (R values, bin ``r`` centred at ``(r + 0.5) / R``) at relative ``positions``.

    Linear interpolation between bin centres, constant beyond the first and last centre
    (``numpy.interp`` semantics).  Returns a tensor of the shape and dtype of ``positions``.
    """
    d = torch.as_tensor(density, dtype=positions.dtype, device=positions.device)
    R = d.shape[-1]
    if R == 1:
        return d[0].expand(positions.shape).clone()
    x = positions * R - 0.5  # in units of bins, 0 = the first centre
    lo = torch.floor(x).clamp(0, R - 2)
    frac = (x - lo).clamp(0.0, 1.0)
    i = lo.long()
    return d[i] * (1.0 - frac) + d[i + 1] * frac


def basket_centres(
    n_content: torch.Tensor,
    n_slots: int,
    basket_size: int,
    dtype: torch.dtype = torch.float64,
    trailing: str = "basket",
) -> torch.Tensor:
    """Relative position of the middle of the basket of each slot: ``(centre key + 0.5) / C``.

    ``n_content``: (..., 1) content keys per row; returns (..., n_slots) (slots beyond a
    row's baskets get meaningless values, which callers mask).  Slot ``j`` spans content
    keys ``j*B .. min((j+1)*B, C) - 1`` and is its own basket, whose centre key is the mean of
    the two; with ``trailing="merge"`` the slots of the last basket (its last full slot and a
    shorter one after it) both get the centre of the merged basket, ``(n_b - 1)*B .. C - 1``.
    """
    B = int(basket_size)
    j = torch.arange(n_slots, device=n_content.device, dtype=dtype)
    C = n_content.to(dtype).clamp(min=1)
    if trailing == "merge":
        last_basket = (basket_count(n_content.clamp(min=1), B, "merge") - 1).to(dtype)  # (..., 1)
        in_last = j >= last_basket
        first = torch.where(in_last, last_basket * B, j * B)
        last = torch.where(in_last, C - 1, torch.minimum((j + 1) * B, C) - 1)
    else:
        first = j * B
        last = torch.minimum((j + 1) * B, C) - 1
    return ((first + last) / 2 + 0.5) / C


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
    settings: BasketSettings,
    *,
    self_key: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """Calibrate attention rows.

    Args:
        weights: post-softmax attention, shape ``(..., K)``.
        start, end: first / last valid key index of each row (inclusive),
            broadcastable to ``weights.shape[:-1]``.
        settings: the calibration in this layer (see the module docstring and :class:`posfair.Calibration`).
        self_key: with a self-attention share, the index of each row's own key (broadcastable to
            ``weights.shape[:-1]``; required then).

    Returns:
        A tensor of the shape of ``weights`` (float64 stays float64; lower precisions are computed in float32).
    """
    cal = BasketSettings.checked(settings)
    a = weights if weights.dtype in (torch.float32, torch.float64) else weights.float()
    lead = a.shape[:-1]
    dev = a.device
    start = torch.as_tensor(start, device=dev).long().expand(lead).unsqueeze(-1)
    end = torch.as_tensor(end, device=dev).long().expand(lead).unsqueeze(-1)
    if cal.temperature is not None:  # TempScale first: the row the formula sees (and blends with) is the tempered one
        a = temper_rows(a, start, end, cal)
        cal = replace(cal, temperature=None)
        if isinstance(cal.strength, float) and cal.strength == 0.0:
            return a  # TempScale alone
    if cal.self_share is not None:
        if self_key is None:
            raise ValueError("self_share needs self_key (the index of each row's own key)")
        return _self_share_rows(a, start, end, self_key, cal)
    return _calibrate(a, start, end, cal)


def temper_rows(a: torch.Tensor, start: torch.Tensor, end: torch.Tensor, cal: BasketSettings) -> torch.Tensor:
    """TempScale on post-softmax rows ``a`` (..., K): ``softmax(logits / T)``, computed as ``a ** (1 / T)``
    renormalised (the same row: ``softmax(x)_k ** (1/T)`` is proportional to ``exp(x_k / T)``), on the rows the
    formula runs on (:func:`~posfair.calibration.rule.engine_calibrates`); other rows unchanged.  ``start`` /
    ``end``: (..., 1).  Keys of probability 0 (padding) stay 0."""
    n_content = (end - int(cal.isolate_eos)) - (start + int(cal.isolate_bos)) + 1
    active = engine_calibrates(n_content, cal.basket_size)
    p = a.pow(1.0 / float(cal.temperature))
    p = p / p.sum(-1, keepdim=True).clamp(min=torch.finfo(a.dtype).tiny)
    return torch.where(active, p, a)


def _blend(strength, calibrated: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """``strength * calibrated + (1 - strength) * original`` over rows (..., n), ``strength`` a number or a tensor
    broadcastable to the rows' leading dimensions (per-head strengths)."""
    s = strength.unsqueeze(-1) if isinstance(strength, torch.Tensor) else strength
    return s * calibrated + (1.0 - s) * original


def _calibrate(a: torch.Tensor, start: torch.Tensor, end: torch.Tensor, cal: BasketSettings) -> torch.Tensor:
    """:func:`calibrate_rows` without a self-attention share; ``start`` / ``end`` (..., 1)."""
    lead, K = a.shape[:-1], a.shape[-1]
    dev = a.device
    B = cal.basket_size
    keys = torch.arange(K, device=dev)
    c_start = start + int(cal.isolate_bos)
    c_end = end - int(cal.isolate_eos)
    n_content = c_end - c_start + 1  # (..., 1)
    active = engine_calibrates(n_content, B)  # rows to calibrate

    content = (keys >= c_start) & (keys <= c_end)
    n_slots = basket_count(K, B)  # the most baskets a row of K keys holds; one more slot below for every other key
    basket = torch.where(content, torch.div(keys - c_start, B, rounding_mode="floor"), n_slots).clamp(0, n_slots)
    mass = torch.zeros((*lead, n_slots + 1), device=dev, dtype=a.dtype)
    mass.scatter_add_(-1, basket, torch.where(content, a, torch.zeros((), device=dev)))
    mass = mass[..., :n_slots]
    n_baskets = basket_count(n_content.clamp(min=1), B).to(a.dtype).squeeze(-1)  # slots ("basket" policy)
    bos = a.gather(-1, start.clamp(0, K - 1)).squeeze(-1) if cal.isolate_bos else None
    eos = a.gather(-1, end.clamp(0, K - 1)).squeeze(-1) if cal.isolate_eos else None
    p = None if cal.prior is None else prior_at(cal.prior, basket_centres(n_content, n_slots, B, a.dtype, cal.trailing))
    w, bos_v, eos_v = basket_weights(mass, n_baskets, bos, eos, cal, prior=p, n_content=n_content.squeeze(-1))
    # each key of basket b is scaled by w_b / m_b (proportions inside the basket kept); other keys carry 0
    factor = torch.where(
        mass > 0, w / mass.clamp(min=torch.finfo(a.dtype).tiny), torch.zeros((), device=dev, dtype=a.dtype)
    )
    factor = torch.cat([factor, torch.zeros((*lead, 1), device=dev, dtype=a.dtype)], dim=-1)
    out = a * factor.gather(-1, basket)
    if bos_v is not None:
        out = torch.where(keys == start, bos_v.unsqueeze(-1), out)
    if eos_v is not None:
        out = torch.where(keys == end, eos_v.unsqueeze(-1), out)
    return torch.where(active, out, a)


def _self_share_rows(a, start, end, self_key, cal: BasketSettings) -> torch.Tensor:
    """The self-attention-share variant of :func:`calibrate_rows` (see the module docstring)."""
    lead, K = a.shape[:-1], a.shape[-1]
    rho = float(cal.self_share)
    sk = torch.as_tensor(self_key, device=a.device).long().expand(lead).unsqueeze(-1)
    inside = (sk >= start) & (sk <= end)  # (..., 1)
    idx = sk.clamp(0, K - 1)
    a_self = torch.where(inside, a.gather(-1, idx), torch.zeros((), dtype=a.dtype, device=a.device))
    keys = torch.arange(K, device=a.device)
    own = (keys == sk) & inside  # (..., K)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    a0 = torch.where(own, zero, a)
    core = _calibrate(a0, start, end, replace(cal, strength=1.0, self_share=None))  # rows too short stay a0
    rest = torch.where(own, zero, core)
    rest_sum = rest.sum(-1, keepdim=True)
    tiny = torch.finfo(a.dtype).tiny
    rest = torch.where(rest_sum > 0, rest / rest_sum.clamp(min=tiny) * (1.0 - rho * a_self), zero)
    cal_rows = torch.where(own, rho * a_self, rest)
    total = cal_rows.sum(-1, keepdim=True)
    cal_rows = torch.where(total > 0, cal_rows / total.clamp(min=tiny), a)
    n_content = (end - int(cal.isolate_eos)) - (start + int(cal.isolate_bos)) + 1
    active = engine_calibrates(n_content, cal.basket_size)
    return torch.where(active, _blend(cal.strength, cal_rows, a), a)


def calibrate_span_(
    probs: torch.Tensor,
    start: int,
    end: int,
    settings: BasketSettings,
    *,
    row_offset: int = 0,
) -> torch.Tensor:
    """:func:`calibrate_rows` in place, for many rows that share one valid span ``[start, end]``.

    The same formula, computed with two passes over the rows instead of a
    scatter: baskets are a reshape of the content slice, and renormalisation
    and the strength blend fold into one multiplier per basket.  Used for
    ``queries="all"``, where every row of a sequence is calibrated.

    With a variant (``prior`` or ``self_share``) the rows go through :func:`calibrate_rows`
    (written back in place); the rows along dimension -2 are the query positions
    ``row_offset, row_offset + 1, ...`` (each row's own key, for ``self_share``).
    """
    cal = BasketSettings.checked(settings)
    if cal.has_variants:
        T = probs.shape[-2]
        rows = torch.arange(row_offset, row_offset + T, device=probs.device)
        self_key = rows.expand(probs.shape[:-1]) if cal.self_share is not None else None
        probs.copy_(calibrate_rows(probs, start, end, cal, self_key=self_key))
        return probs
    B = cal.basket_size
    c_start = start + int(cal.isolate_bos)
    c_end = end - int(cal.isolate_eos)
    C = c_end - c_start + 1
    if not engine_calibrates(C, B):
        return probs
    if cal.temperature is not None:  # TempScale (as temper_rows): every row here shares the span
        probs.pow_(1.0 / float(cal.temperature))
        probs.div_(probs.sum(-1, keepdim=True).clamp(min=torch.finfo(probs.dtype).tiny))
        if isinstance(cal.strength, float) and cal.strength == 0.0:
            return probs  # TempScale alone
    n_full, tail = divmod(C, B)
    content = probs[..., c_start : c_end + 1]
    body = content[..., : n_full * B].unflatten(-1, (n_full, B))
    mass = body.sum(-1)
    if tail:
        mass = torch.cat([mass, content[..., n_full * B :].sum(-1, keepdim=True)], dim=-1)
    bos = probs[..., start].clone() if cal.isolate_bos else None
    eos = probs[..., end].clone() if cal.isolate_eos else None
    w, bos_v, eos_v = basket_weights(mass, basket_count(C, B), bos, eos, cal, n_content=C)
    one = torch.ones((), dtype=probs.dtype, device=probs.device)
    mult = torch.where(mass > 0, w / mass.clamp(min=torch.finfo(probs.dtype).tiny), one)  # a basket of mass 0 stays 0
    body.mul_(mult[..., :n_full].unsqueeze(-1))
    if tail:
        content[..., n_full * B :].mul_(mult[..., n_full:])
    if bos_v is not None:
        probs[..., start] = bos_v
    if eos_v is not None:
        probs[..., end] = eos_v
    return probs


def basket_weights(
    mass: torch.Tensor,
    n_baskets: torch.Tensor | int,
    bos: torch.Tensor | None,
    eos: torch.Tensor | None,
    settings: BasketSettings,
    *,
    prior: torch.Tensor | None = None,
    n_content: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The basket formula on masses: what each slot and isolated key weighs after calibration.

    A calibrated row keeps the proportions inside each content basket, so it is fully
    described by one mass per basket and one per isolated key.  Given the original row's
    masses -- ``mass`` (..., n) per content *slot* (``B`` consecutive content keys, the last
    slot of a row possibly shorter; 0 for slots beyond the row's ``n_baskets`` slots), ``bos`` /
    ``eos`` (...) the isolated keys' probabilities (None when the key is not isolated) -- returns
    ``(w, bos_value, eos_value)``: the calibrated row is ``sum_j w_j * (row restricted to slot j,
    renormalised) + bos_value * e_bos + eos_value * e_eos``, exactly what :func:`calibrate_span_`
    produces (renormalisation and the strength blend included; a basket of mass 0 stays 0).
    The caller decides whether the row is calibrated at all (``C >= basket_size``); this
    function assumes it is.

    ``settings``: the calibration (its strength, the isolated keys' weights, the trailing-basket
    policy and the basket size, read only by the ``"merge"`` / ``"weighted"`` policies; not its prior vector).
    ``prior``: the positional-prior variant's density at each slot's basket centre (broadcastable to
    ``mass``; :func:`prior_at` of :func:`basket_centres`), None for equal mass per basket.

    The trailing-basket policy (module docstring): ``"basket"``: every slot is a basket.
    ``"merge"`` / ``"weighted"`` need ``n_content`` (C per row, broadcastable to ``mass.shape[:-1]``):
    with ``"merge"`` a last slot shorter than B forms one basket with the slot before it (the merged
    basket's weight is shared by its two slots in proportion to their masses, which keeps the
    proportions inside it); with ``"weighted"`` a slot of ``n`` keys counts ``n / B`` baskets.
    """
    cal = BasketSettings.checked(settings)
    shares = dict(strength=cal.strength, bos_weight=cal.bos_weight, eos_weight=cal.eos_weight, prior=prior)
    if cal.trailing == "basket":
        return _basket_weights(mass, n_baskets, bos, eos, **shares)
    if n_content is None:
        raise ValueError(f"trailing={cal.trailing!r} needs n_content")
    B = cal.basket_size
    lead = mass.shape[:-1]
    C = torch.as_tensor(n_content, device=mass.device).long().expand(lead)
    n_slots = torch.as_tensor(n_baskets, device=mass.device).round().long().expand(lead)
    if cal.trailing == "weighted":
        j = torch.arange(mass.shape[-1], device=mass.device)
        keys = (C.unsqueeze(-1) - j * B).clamp(0, B)  # keys in each slot (0 beyond the row)
        units = keys.to(mass.dtype) / B
        n_units = (C.to(mass.dtype) / B).clamp(min=1.0)  # C / B baskets in all
        return _basket_weights(mass, n_units, bos, eos, **shares, units=units, in_row=keys > 0)
    if cal.trailing != "merge":
        raise ValueError(f"trailing must be 'basket', 'merge' or 'weighted'; got {cal.trailing!r}")
    n_b = basket_count(C, B, "merge")  # baskets after merging: n_slots or n_slots - 1
    merging = (n_b < n_slots).unsqueeze(-1)  # (..., 1): the last slot joins the one before
    last = (n_slots - 1).clamp(min=0).unsqueeze(-1)
    prev = (n_slots - 2).clamp(min=0).unsqueeze(-1)
    zero = torch.zeros((), dtype=mass.dtype, device=mass.device)
    m_last = mass.gather(-1, last)
    merged = mass.scatter_add(-1, prev, torch.where(merging, m_last, zero))
    merged = merged.scatter(-1, last, torch.where(merging, zero, m_last))  # per basket; slot `last` is then empty
    w, bos_v, eos_v = _basket_weights(merged, n_b, bos, eos, **shares)
    # the merged basket's weight, shared by its two slots in proportion to their masses
    m_merged = merged.gather(-1, prev)
    factor = torch.where(m_merged > 0, w.gather(-1, prev) / m_merged.clamp(min=torch.finfo(mass.dtype).tiny), zero)
    w = w.scatter(-1, prev, torch.where(merging, mass.gather(-1, prev) * factor, w.gather(-1, prev)))
    w = w.scatter(-1, last, torch.where(merging, m_last * factor, w.gather(-1, last)))
    return w, bos_v, eos_v


def _basket_weights(
    mass: torch.Tensor,
    n_baskets: torch.Tensor | int,
    bos: torch.Tensor | None,
    eos: torch.Tensor | None,
    *,
    strength: float,
    bos_weight: Share,
    eos_weight: Share,
    prior: torch.Tensor | None,
    units: torch.Tensor | None = None,
    in_row: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`basket_weights` on baskets: ``mass`` (..., n) per basket, ``n_baskets`` of them per row.

    ``units`` (``trailing="weighted"``): how many baskets each one counts as (its keys / B), with
    ``n_baskets`` their sum (C / B) and ``in_row`` the baskets of the row; None: one each.
    """
    n_b = torch.as_tensor(n_baskets, dtype=mass.dtype, device=mass.device).expand(mass.shape[:-1])
    n_iso = int(bos is not None) + int(eos is not None)
    n_total = n_b + n_iso if n_iso else n_b
    zero = torch.zeros((), dtype=mass.dtype, device=mass.device)
    shares = []
    for orig, weight in ((bos, bos_weight), (eos, eos_weight)):
        if orig is not None:
            shares.append(_share(weight, orig, n_total))
    iso_total = sum(shares, torch.zeros_like(n_b))
    nonzero = mass > 0
    tiny = torch.finfo(mass.dtype).tiny
    if prior is None:
        per = ((1.0 - iso_total) / n_b.clamp(min=1)).clamp(min=0.0)  # target mass of each content basket
        target = per.unsqueeze(-1) * nonzero
        if units is not None:
            target = target * units  # a basket of n keys counts n / B baskets
    else:  # basket b gets m_b / p_b, the content scaled to the mass the isolated keys leave (as calibrate_rows)
        if in_row is None:
            in_row = torch.arange(mass.shape[-1], device=mass.device) < n_b.unsqueeze(-1)
        tilted = torch.where(in_row, mass / prior, zero)
        denom = tilted.sum(-1)
        scale = torch.where(denom > 0, (1.0 - iso_total).clamp(min=0.0) / denom.clamp(min=tiny), zero)
        target = torch.where(in_row & nonzero, scale.unsqueeze(-1) * tilted, zero)
    total = target.sum(-1) + iso_total  # the calibrated row's sum before renormalisation
    ok = total > 0
    inv = torch.where(ok, 1.0 / total.clamp(min=tiny), zero)
    # step 5's blend, one lerp a tensor (the fused kernel runs this once per block of rows: issue 50, item 8); a row
    # with nothing to renormalise (total 0) blends with weight 0, so it keeps its masses
    blend = (ok.to(mass.dtype) * strength).to(mass.dtype)
    w = torch.lerp(mass, target.mul_(inv.unsqueeze(-1)), blend.unsqueeze(-1))
    isolated = (o for o in (bos, eos) if o is not None)
    it = iter([torch.lerp(orig, share * inv, blend) for orig, share in zip(isolated, shares, strict=True)])
    return w, next(it) if bos is not None else None, next(it) if eos is not None else None
