"""A calibration made concrete: :class:`ResolvedCalibration` (a
:class:`~posfair.calibration.params.Calibration` for one model: :meth:`~posfair.calibration.params.Calibration.resolve`),
:class:`BasketSettings` (what the basket formula reads in one layer: :meth:`ResolvedCalibration.baskets`) and
:func:`scheduled_strength` (the strength of one calibrated layer under a schedule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from numbers import Real
from typing import TYPE_CHECKING, Any, Literal

from posfair.calibration.positional_prior import PositionalPrior
from posfair.calibration.setting_values import SCHEDULES, Schedule, Share, Trailing

if TYPE_CHECKING:
    import torch


def scheduled_strength(strength: float, schedule: str, rank: int, count: int) -> float:
    """The strength of the ``rank``-th (0-based, from the first) of ``count`` calibrated layers under ``schedule``:
    ``"flat"`` alpha in every layer; ``"rising"`` alpha * (rank + 1) / count (full strength in the last calibrated
    layer); ``"falling"`` alpha * (count - rank) / count (full strength in the first)."""
    if schedule == "flat":
        return strength
    if schedule == "rising":
        return strength * (rank + 1) / count
    if schedule == "falling":
        return strength * (count - rank) / count
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")


@dataclass(frozen=True)
class ResolvedCalibration:
    """A :class:`Calibration` made concrete for one model (:meth:`Calibration.resolve`): the same fields, every one
    concrete, and the model's ``pooling``."""

    basket_size: int
    layers: tuple[int, ...]
    strength: float
    isolate_bos: bool
    isolate_eos: bool
    bos_weight: Share
    eos_weight: Share
    queries: Literal["pool", "all"]
    pooling: str
    prior: PositionalPrior | None = None
    self_share: float | None = None
    trailing: Trailing = "basket"
    schedule: Schedule = "flat"
    head_strengths: tuple[tuple[int, Any], ...] | None = None
    temperature: float | None = None
    layer_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_set", frozenset(self.layers))

    @property
    def has_variants(self) -> bool:
        """Whether a positional prior or a self-attention share is set (the fused all-rows kernel does the prior, not the share)."""
        return self.prior is not None or self.self_share is not None

    @property
    def differentiable(self) -> bool:
        """Whether some per-head strengths are tensors that autograd tracks (a fit in progress: the explicit path
        computes such layers, never the per-basket kernels)."""
        return any(getattr(v, "requires_grad", False) for _, v in self.head_strengths or ())

    def head_strengths_in(self, layer: int | None) -> Any:
        """The per-head strengths in layer ``layer`` (a tuple of floats, or a tensor during a fit), None where the
        layer has none (its strength is :meth:`layer_strength`)."""
        for i, values in self.head_strengths or ():
            if i == layer:
                return values
        return None

    def layer_strength(self, layer: int | None = None) -> float:
        """The strength in layer ``layer`` (:func:`scheduled_strength` over the calibrated layers, in order)."""
        if self.schedule == "flat":
            return self.strength
        if layer is None or layer not in self.layer_set:
            raise ValueError(
                f"a {self.schedule} strength schedule needs one of the calibrated layers {list(self.layers)}"
            )
        ordered = sorted(self.layers)
        return scheduled_strength(self.strength, self.schedule, ordered.index(layer), len(ordered))

    def baskets(self, layer: int | None = None) -> BasketSettings:
        """What the basket formula reads in layer ``layer``: the strength there (:meth:`layer_strength`) and the
        positional prior's vector there; every other field as it is (``layer`` None: a flat schedule and a prior
        shared by every layer).  The one function that builds the kernels' :class:`BasketSettings`; a forward pass
        builds it once per calibrated layer (:meth:`posfair.calibration.state.ForwardState.baskets`)."""
        same = {f.name: getattr(self, f.name) for f in fields(BasketSettings) if f.name != "head_strength"}
        prior = None if self.prior is None else self.prior.density(layer)
        heads = self.head_strengths_in(layer)
        return BasketSettings(
            **{**same, "strength": self.layer_strength(layer), "prior": prior, "head_strength": heads}
        )


@dataclass(frozen=True)
class BasketSettings:
    """What the basket formula reads: one calibration in one layer, every value concrete.

    The one value the basket functions take (:func:`~posfair.calibration.baskets.calibrate_rows`,
    :func:`~posfair.calibration.baskets.calibrate_span_`, :func:`~posfair.calibration.baskets.basket_weights`,
    the fused and CUDA kernels) and that says which texts change
    (:func:`posfair.calibration.rule.row_changes`).  Built from a calibration by
    :meth:`ResolvedCalibration.baskets`, once per calibrated layer and forward pass
    (:meth:`posfair.calibration.state.ForwardState.baskets`), or directly with these defaults
    (``BasketSettings(basket_size=4, strength=0.5)``); the basket functions take nothing else.  ``strength`` is the
    strength in this layer (the schedule applied) and ``prior`` the positional prior's density vector in this
    layer (None: equal mass per basket); the other fields are :class:`Calibration`'s.  A new setting the formula
    reads is a field here (named as in :class:`Calibration`, which fills it) and its use in the formula.
    """

    basket_size: int
    strength: float = 1.0
    isolate_bos: bool = False
    isolate_eos: bool = False
    bos_weight: Share = "original"
    eos_weight: Share = "equal"
    prior: Sequence[float] | torch.Tensor | None = None
    self_share: float | None = None
    trailing: Trailing = "basket"
    head_strength: Sequence[float] | torch.Tensor | None = None
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.basket_size < 1:
            raise ValueError(f"basket_size must be >= 1; got {self.basket_size}")
        if isinstance(self.strength, Real) and not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1]; got {self.strength}")
        if self.temperature is not None and not float(self.temperature) > 0.0:
            raise ValueError(f"temperature must be > 0; got {self.temperature}")

    @staticmethod
    def checked(settings: BasketSettings) -> BasketSettings:
        """``settings`` as a basket function takes it: a :class:`BasketSettings` (TypeError otherwise) whose per-head
        strengths, if any, are laid out as the rows' heads (:meth:`for_heads`; ValueError otherwise)."""
        if not isinstance(settings, BasketSettings):
            raise TypeError(f"the basket functions take a BasketSettings; got {type(settings).__name__}")
        if settings.head_strength is not None:
            raise ValueError(
                "per-head strengths reach the basket functions as a strength tensor laid out like the rows' heads: "
                "call settings.for_heads(shape, rows) first"
            )
        return settings

    def head_vector(self, like: torch.Tensor) -> torch.Tensor:
        """The per-head strengths as a 1-D tensor on ``like``'s device, in its dtype (float32 for a lower precision)."""
        wide = like.dtype.is_floating_point and like.element_size() >= 4
        dt = like.dtype if wide else like.new_empty(0).float().dtype  # float32 for a lower precision
        hs = self.head_strength
        if hasattr(hs, "requires_grad"):  # a tensor (a fit): its graph kept
            return hs.to(device=like.device, dtype=dt).reshape(-1)
        return like.new_tensor(hs, dtype=dt)

    def for_heads(self, shape: Sequence[int], like: torch.Tensor) -> BasketSettings:
        """This setting for the basket functions: per-head strengths (if any) as the ``strength`` tensor of ``shape``,
        the heads laid out as the leading dimensions of the rows they blend (e.g. ``(kv_heads, groups, 1)`` for
        rows ``(batch, kv_heads, groups, queries, keys)``); ``self`` when the layer has one strength."""
        if self.head_strength is None:
            return self
        v = self.head_vector(like)
        if v.numel() != math.prod(shape):
            raise ValueError(f"{v.numel()} per-head strengths for a layer of {math.prod(shape)} attention heads")
        return replace(self, strength=v.view(*shape), head_strength=None)

    @property
    def has_variants(self) -> bool:
        """Whether a positional prior or a self-attention share is set."""
        return self.prior is not None or self.self_share is not None
