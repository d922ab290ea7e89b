"""The calibration parameters object.

``Calibration`` is immutable and validated on construction.  Fields left as
:data:`POOLING_DECIDES` are resolved against a concrete model (its pooling and its number of
layers) by :meth:`Calibration.resolve`, which returns a :class:`ResolvedCalibration`
holding only concrete values; :meth:`ResolvedCalibration.baskets` turns that into the one value the
basket formula takes in one layer (:class:`BasketSettings`).  Definitions: ``docs/definitions.md``, section 1.

Inside :class:`Calibration` ``None`` means one thing: *off* (no positional prior, no self-attention
share).  The settings a model's pooling decides (``isolate_bos``, ``isolate_eos``, ``queries``) hold
:data:`POOLING_DECIDES` until resolved; the constructor still takes ``None`` for them (and stores
:data:`POOLING_DECIDES`), and :meth:`Calibration.to_dict` writes ``None``, so keys are unchanged.

The string forms -- :meth:`Calibration.label` (short, for tables), :meth:`Calibration.describe` (in
words), :meth:`Calibration.spec` (the command-line form, which :meth:`Calibration.parse` reads back
exactly) -- are all written from one table of the settings beyond ``B,layers,alpha``
(:data:`_FORMS`); :meth:`Calibration.key` is a digest of :meth:`Calibration.to_dict`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import torch

Share = Literal["equal", "original"] | float
#: the parts a variant is made of, in the order a combination names them
VARIANT_PARTS: tuple[str, ...] = ("prior", "self", "special")
#: the variant names (what ``Calibration.variant`` reports and the tuner searches): the papers' formula, each
#: part alone and every combination of parts, named by its parts joined with "+" in VARIANT_PARTS' order
VARIANTS: tuple[str, ...] = (
    "uniform",
    "prior",
    "self",
    "special",
    "prior+self",
    "prior+special",
    "self+special",
    "prior+self+special",
)
Pooling = Literal["cls", "mean", "lasttoken"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "lasttoken")
Trailing = Literal["basket", "merge", "weighted"]
#: the trailing-basket policies (``Calibration.trailing``); the first is the papers' and the default
TRAILING: tuple[str, ...] = ("basket", "merge", "weighted")
Schedule = Literal["flat", "rising", "falling"]
#: the per-layer strength schedules (``Calibration.schedule``); the first is the papers' and the default
SCHEDULES: tuple[str, ...] = ("flat", "rising", "falling")


class PoolingDecides(enum.Enum):
    """The type of :data:`POOLING_DECIDES` (an enum, so it survives copying between processes as itself)."""

    POOLING_DECIDES = "pooling decides"

    def __repr__(self) -> str:
        return "POOLING_DECIDES"

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of POOLING_DECIDES is not defined: resolve the calibration for a pooling first"
        )


#: the value of ``isolate_bos`` / ``isolate_eos`` / ``queries`` left to the model's pooling (``None`` is accepted
#: for it); :meth:`Calibration.resolve` replaces it (CLS pooling isolates BOS, last-token pooling BOS and EOS,
#: mean pooling nothing; "all" query rows for mean pooling, the pooling row otherwise)
POOLING_DECIDES: Final = PoolingDecides.POOLING_DECIDES


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


def _check_share(name: str, value: Any) -> Share:
    if isinstance(value, str):
        if value not in ("equal", "original"):
            raise ValueError(f"{name} must be 'equal', 'original' or a float in [0, 1); got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be 'equal', 'original' or a float in [0, 1); got {value!r}")
    value = float(value)
    if not (0.0 <= value < 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be in [0, 1) when given as a float; got {value}")
    return value


def _finite_positive(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a sequence of positive numbers; got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or float(v) <= 0:
            raise ValueError(f"{name} must hold finite numbers > 0 (the prior divides by them); got {v!r}")
        out.append(float(v))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return tuple(out)


@dataclass(frozen=True)
class PositionalPrior:
    """The model's mean attention mass over *relative* position, by which positional-prior calibration divides.

    ``values``: one vector per layer, each of ``bins`` positive numbers: the mean attention
    *density* of the calibrated query rows over ``bins`` equal bins of relative content
    position (bin ``r`` covers ``[r / bins, (r + 1) / bins)`` of the content keys; its scale
    does not matter, only ratios between bins).  ``layers``: the 0-based layer of each vector;
    ``None`` with a single vector = the same prior for every calibrated layer.
    A row's basket ``b`` is given the prior's value at the basket's centre (relative
    position of its middle key), linearly interpolated between bin centres and held constant
    beyond the first / last bin centre (:func:`posfair.calibration.baskets.prior_at`), so a
    prior estimated once serves documents of any length and any basket size.
    Estimate one with :func:`posfair.attention.prior.estimate_prior`.
    """

    values: tuple[tuple[float, ...], ...]
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        vals = self.values
        if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence) or not vals:
            raise ValueError("prior values must be a non-empty list of vectors (one per layer)")
        vecs = tuple(_finite_positive(f"prior vector {i}", v) for i, v in enumerate(vals))
        if len({len(v) for v in vecs}) != 1:
            raise ValueError(f"prior vectors must all have the same number of bins; got {[len(v) for v in vecs]}")
        object.__setattr__(self, "values", vecs)
        layers = self.layers
        if layers is None:
            if len(vecs) != 1:
                raise ValueError(f"a prior of {len(vecs)} vectors needs their layers (one 0-based index per vector)")
        else:
            if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
                raise ValueError(f"prior layers must be a list of 0-based layer indices; got {layers!r}")
            idx = list(layers)
            for i in idx:
                if isinstance(i, bool) or not isinstance(i, Integral) or i < 0:
                    raise ValueError(f"prior layers must be 0-based layer indices (ints >= 0); got {i!r}")
            if len(idx) != len(vecs):
                raise ValueError(f"prior has {len(vecs)} vectors for {len(idx)} layers")
            if len(set(idx)) != len(idx):
                raise ValueError(f"prior layers contain duplicates: {idx}")
            object.__setattr__(self, "layers", tuple(int(i) for i in idx))

    @property
    def bins(self) -> int:
        return len(self.values[0])

    def density(self, layer: int | None) -> tuple[float, ...]:
        """The vector of layer ``layer`` (the single vector when the prior is shared by all layers)."""
        if self.layers is None:
            return self.values[0]
        if layer is None or layer not in self.layers:
            raise ValueError(
                f"the positional prior has no vector for layer {layer} (it covers layers {list(self.layers)})"
            )
        return self.values[self.layers.index(layer)]

    def to_dict(self) -> dict[str, Any]:
        return {"layers": None if self.layers is None else list(self.layers), "values": [list(v) for v in self.values]}

    @classmethod
    def from_dict(cls, d: Any) -> PositionalPrior:
        if isinstance(d, PositionalPrior):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"a positional prior must be a dict with 'values' (and 'layers'); got {type(d).__name__}")
        unknown = set(d) - {"layers", "values", "bins"}
        if unknown:
            raise ValueError(f"unknown positional prior fields: {sorted(unknown)}")
        if "values" not in d:
            raise ValueError("a positional prior needs 'values' (one vector per layer)")
        prior = cls(
            values=tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in d["values"]), layers=d.get("layers")
        )
        if d.get("bins") is not None and d["bins"] != prior.bins:
            raise ValueError(f"positional prior: 'bins' = {d['bins']} but the vectors have {prior.bins} values")
        return prior

    def digest(self) -> str:
        """6 hex digits identifying the prior (in labels)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class Calibration:
    """Attention-calibration settings.

    Args:
        basket_size: B, number of consecutive content keys per basket (>= 1).
        layers: which layers are calibrated.  ``int k`` = the last k layers;
            ``float f`` in (0, 1] = the last ``max(1, floor(f * N))`` layers;
            a sequence of ints = explicit 0-based layer indices.
        strength: alpha in [0, 1]; 0 = the stock model, 1 = full calibration.
        isolate_bos / isolate_eos: keep the first / last valid key out of the
            baskets.  :data:`POOLING_DECIDES` (default; ``None`` is taken for it): CLS
            pooling isolates BOS; last-token pooling isolates BOS and EOS; mean pooling
            isolates nothing.
        bos_weight / eos_weight: mass given to an isolated key: ``"equal"``
            (1 / n_total, the papers' formulation), ``"original"`` (the key is
            left alone) or a float in [0, 1).
        queries: ``"pool"`` (the pooling token's row) or ``"all"`` (every valid
            row).  :data:`POOLING_DECIDES` (default; ``None`` is taken for it): "pool"
            for CLS / last-token pooling, "all" for mean.
        prior: *positional-prior calibration* (a :class:`PositionalPrior`, or its dict):
            instead of giving every content basket the same mass, each basket's mass is
            divided by the prior's value at its relative position and the content is
            renormalised, so the average positional tilt goes and the row's content-driven
            variation stays.  ``None`` (default): the papers' equal mass per basket.
        self_share: *self-attention share* rho in [0, 1]: each calibrated query row keeps
            ``rho`` times the mass it originally gave its own key (the pooling token's key
            for CLS / last-token pooling, the diagonal key for every row with
            ``queries="all"``); the rest of the row is calibrated without that key and
            scaled to the remaining mass.  It takes precedence over ``bos_weight`` /
            ``eos_weight`` when the own key is an isolated key.  ``None`` (default): the
            own key is treated like any other key.
        trailing: what a *trailing basket* gets -- the last content basket when it is
            shorter than ``basket_size`` (``C`` not a multiple of B).  ``"basket"``
            (default, the papers' definition): it is a basket like the others, so every
            basket gets the same mass however few keys it holds (one extra token can take
            a whole basket's share).  ``"merge"``: a trailing basket shorter than B (any
            length 1..B-1) joins the basket before it, so there are ``max(1, floor(C / B))``
            baskets, each of B keys except the last, which holds B..2B-1; a text with
            ``C < 2B`` is then one basket and is left unchanged (unless an isolated key or
            a self-attention share moves mass).  ``"weighted"``: each basket's target mass
            is proportional to its number of keys (a basket of ``n`` keys counts ``n / B``
            baskets, so there are ``C / B`` baskets in all and ``"equal"`` isolated keys get
            ``1 / (C / B + #isolated)``); identical to ``"basket"`` when B divides C.  With
            a positional prior, a basket's target ``m_b / p_b`` already scales with its size
            (``p_b`` is a density), so ``"weighted"`` changes only the ``"equal"`` shares
            there; ``"merge"`` gives the merged basket one prior value, at its centre.
        schedule: how the strength is spread over the calibrated layers.  ``"flat"``
            (default, the papers'): ``strength`` in every calibrated layer.  ``"rising"``:
            the k-th of K calibrated layers (1-based, from the first) gets
            ``strength * k / K``, full strength in the last.  ``"falling"``:
            ``strength * (K - k + 1) / K``, full strength in the first.  ``strength`` 0
            is the stock model under every schedule.

    The third variant, *special-token mass* (a target share for the BOS / EOS keys
    distinct from the content baskets), is ``isolate_bos`` / ``isolate_eos`` with
    ``bos_weight`` / ``eos_weight``; :meth:`with_special` sets both at once and the
    command line's ``special=`` does the same.  New fields are written by
    :meth:`to_dict` (hence :meth:`key`) only when set, so settings without them keep
    their keys and labels.

    ``None`` means *off* (``prior``, ``self_share``); a setting the model's pooling decides
    holds :data:`POOLING_DECIDES`.  String forms: :meth:`label` (short), :meth:`describe`
    (words), :meth:`spec` (the command line; :meth:`parse` reads it back), all from one
    table; :meth:`key` digests :meth:`to_dict`.
    """

    basket_size: int = 128
    layers: int | float | tuple[int, ...] = 0.5
    strength: float = 0.5
    isolate_bos: bool | PoolingDecides = POOLING_DECIDES
    isolate_eos: bool | PoolingDecides = POOLING_DECIDES
    bos_weight: Share = "original"
    eos_weight: Share = "equal"
    queries: Literal["pool", "all"] | PoolingDecides = POOLING_DECIDES
    prior: PositionalPrior | None = None
    self_share: float | None = None
    trailing: Trailing = "basket"
    schedule: Schedule = "flat"

    def __post_init__(self) -> None:
        b = self.basket_size
        if isinstance(b, bool) or not isinstance(b, Integral) or b < 1:
            raise ValueError(f"basket_size must be an integer >= 1; got {b!r}")
        object.__setattr__(self, "basket_size", int(b))

        s = self.strength
        if isinstance(s, bool) or not isinstance(s, Real) or math.isnan(float(s)) or not 0.0 <= float(s) <= 1.0:
            raise ValueError(f"strength must be a number in [0, 1]; got {s!r}")
        object.__setattr__(self, "strength", float(s))

        layers = self.layers
        if isinstance(layers, bool):
            raise ValueError(
                f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}"
            )
        if isinstance(layers, Integral):
            if layers < 1:
                raise ValueError(f"layers as an int is the number of last layers and must be >= 1; got {layers}")
            layers = int(layers)
        elif isinstance(layers, Real):
            if not 0.0 < float(layers) <= 1.0:
                raise ValueError(f"layers as a float is a fraction of the layers and must be in (0, 1]; got {layers}")
            layers = float(layers)
        elif isinstance(layers, Sequence) and not isinstance(layers, str):
            idx = list(layers)
            if not idx:
                raise ValueError("layers as a sequence of layer indices must not be empty")
            for i in idx:
                if isinstance(i, bool) or not isinstance(i, Integral) or i < 0:
                    raise ValueError(f"layers must contain 0-based layer indices (ints >= 0); got {i!r}")
            if len(set(idx)) != len(idx):
                raise ValueError(f"layers contains duplicate indices: {idx}")
            layers = tuple(sorted(int(i) for i in idx))
        else:
            raise ValueError(
                f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}"
            )
        object.__setattr__(self, "layers", layers)

        object.__setattr__(self, "bos_weight", _check_share("bos_weight", self.bos_weight))
        object.__setattr__(self, "eos_weight", _check_share("eos_weight", self.eos_weight))
        fixed = sum(w for w in (self.bos_weight, self.eos_weight) if isinstance(w, float))
        if fixed >= 1.0:
            raise ValueError(
                f"bos_weight + eos_weight = {fixed} leaves no attention mass for the content baskets; their sum must be < 1"
            )
        for name in ("isolate_bos", "isolate_eos", "queries"):  # None: the pooling decides
            if getattr(self, name) is None:
                object.__setattr__(self, name, POOLING_DECIDES)
        for name in ("isolate_bos", "isolate_eos"):
            v = getattr(self, name)
            if v is not POOLING_DECIDES and not isinstance(v, bool):
                raise ValueError(f"{name} must be True, False or None (the pooling decides); got {v!r}")
        if self.queries is not POOLING_DECIDES and self.queries not in ("pool", "all"):
            raise ValueError(f"queries must be 'pool', 'all' or None (the pooling decides); got {self.queries!r}")
        if self.prior is not None:
            object.__setattr__(self, "prior", PositionalPrior.from_dict(self.prior))
        rho = self.self_share
        if rho is not None:
            if (
                isinstance(rho, bool)
                or not isinstance(rho, Real)
                or math.isnan(float(rho))
                or not 0.0 <= float(rho) <= 1.0
            ):
                raise ValueError(f"self_share must be a number in [0, 1] or None; got {rho!r}")
            object.__setattr__(self, "self_share", float(rho))
        if not isinstance(self.trailing, str) or self.trailing not in TRAILING:
            raise ValueError(
                f"trailing must be one of {', '.join(repr(t) for t in TRAILING)} (what a last basket shorter than "
                f"basket_size gets); got {self.trailing!r}"
            )
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(repr(t) for t in SCHEDULES)} (how the strength is spread over "
                f"the calibrated layers); got {self.schedule!r}"
            )

    # -- variants -----------------------------------------------------------------------------
    @property
    def variant(self) -> str:
        """Which variant this setting is: ``"uniform"`` (the papers'), ``"prior"``, ``"self"``, ``"special"``, or a
        combination named by its parts joined with ``+`` in that order (``"prior+special"``, ``"self+special"``, ...).
        """
        used = (self.prior is not None, self.self_share is not None, self.special_share is not None)
        parts = [name for name, on in zip(VARIANT_PARTS, used, strict=True) if on]
        return "+".join(parts) or "uniform"

    @property
    def special_share(self) -> Share | None:
        """The special-token share set by :meth:`with_special` (BOS and EOS isolated with one weight), else None."""
        if self.isolate_bos is True and self.isolate_eos is True and self.bos_weight == self.eos_weight:
            return self.bos_weight
        return None

    def with_special(self, share: Share) -> Calibration:
        """The special-token-mass variant: BOS and EOS isolated, each given ``share``
        (``"original"``: their own mass is kept; ``"equal"``: one basket's; a float: that share of the row)."""
        return replace(self, isolate_bos=True, isolate_eos=True, bos_weight=share, eos_weight=share)

    # -- resolution against a model ---------------------------------------------------------
    def layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The 0-based indices of the calibrated layers for a model with ``num_layers`` layers."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}")
        if isinstance(self.layers, tuple):
            bad = [i for i in self.layers if i >= num_layers]
            if bad:
                raise ValueError(
                    f"layers {bad} out of range: the model has {num_layers} layers (valid indices 0..{num_layers - 1})"
                )
            return self.layers
        if isinstance(self.layers, int):
            if self.layers > num_layers:
                raise ValueError(
                    f"layers={self.layers} asks for the last {self.layers} layers, but the model has only {num_layers}"
                )
            k = self.layers
        else:
            k = max(1, math.floor(self.layers * num_layers))
        return tuple(range(num_layers - k, num_layers))

    def pooled(self, pooling: str) -> Calibration:
        """This setting with every value :data:`POOLING_DECIDES` made concrete for a model with ``pooling``:
        CLS pooling isolates BOS, last-token pooling BOS and EOS, mean pooling nothing; mean pooling calibrates
        every query row (``"all"``), the others the pooling row (``"pool"``).  The one place the pooling decides."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
        decided = dict(
            isolate_bos=pooling in ("cls", "lasttoken"),
            isolate_eos=pooling == "lasttoken",
            queries="all" if pooling == "mean" else "pool",
        )
        return replace(self, **{k: v for k, v in decided.items() if getattr(self, k) is POOLING_DECIDES})

    def isolation(self, pooling: str) -> tuple[bool, bool]:
        """``(isolate_bos, isolate_eos)`` for a model with ``pooling`` (:meth:`pooled`)."""
        concrete = self.pooled(pooling)
        return concrete.isolate_bos, concrete.isolate_eos

    def resolve(self, pooling: str, num_layers: int) -> ResolvedCalibration:
        """This setting for a model with ``pooling`` and ``num_layers`` layers (:meth:`pooled`, :meth:`layer_indices`)."""
        concrete = self.pooled(pooling)
        layers = self.layer_indices(num_layers)
        if self.prior is not None and self.prior.layers is not None:
            missing = [i for i in layers if i not in self.prior.layers]
            if missing:
                raise ValueError(
                    f"the positional prior covers layers {list(self.prior.layers)} but the calibration also calibrates layers {missing}"
                )
        values = {f.name: getattr(concrete, f.name) for f in fields(Calibration)}
        return ResolvedCalibration(**{**values, "layers": layers, "pooling": pooling})

    # -- (de)serialisation and the string forms (one table, :data:`_FORMS`) ---------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; :data:`POOLING_DECIDES` as ``null``; the fields added after the first release
        (``prior``, ``self_share``, ``trailing``, ``schedule``) only when not the default (so older settings keep
        their keys)."""
        d = asdict(self)
        if isinstance(d["layers"], tuple):
            d["layers"] = list(d["layers"])
        for form in _FORMS:
            if d[form.field] is POOLING_DECIDES:
                d[form.field] = None
            if not form.keyed_at_default and form.at_default(getattr(self, form.field)):
                del d[form.field]
        if self.prior is not None:
            d["prior"] = self.prior.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown calibration fields: {sorted(unknown)}")
        d = dict(d)
        if isinstance(d.get("layers"), list):
            d["layers"] = tuple(d["layers"])
        if d.get("prior") is not None:
            d["prior"] = PositionalPrior.from_dict(d["prior"])
        return cls(**d)

    def key(self) -> str:
        """A short stable identifier of :meth:`to_dict` (used in cache keys and file names)."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _given(self) -> list[tuple[_Form, Any]]:
        """The settings beyond ``B,layers,alpha`` that are not at their default, in :data:`_FORMS` order."""
        return [(form, v) for form in _FORMS if not form.at_default(v := getattr(self, form.field))]

    def label(self) -> str:
        """The short form for tables, e.g. ``B128-L0.5-a0.5``, ``B16-L1-a1-bos1-eos1-bw0.1-ew0.1`` (a prior by its
        shape and digest; not read back: :meth:`spec` is the form that parses)."""
        head = [f"B{self.basket_size}", f"L{_layers_text(self.layers)}", f"a{self.strength:g}"]
        return "-".join(head + [form.label(v) for form, v in self._given()])

    def describe(self) -> str:
        """The calibration in words, for a person beside its :meth:`label`, e.g. "baskets of 128 tokens, the
        last 50% of layers, strength 0.5" for ``B128-L0.5-a0.5``."""
        if isinstance(self.layers, tuple):
            layers = f"layers {', '.join(str(i) for i in self.layers)} (0-based)"
        elif isinstance(self.layers, float):
            layers = "every layer" if self.layers >= 1 else f"the last {self.layers:.0%} of layers"
        else:
            layers = "the last layer" if self.layers == 1 else f"the last {self.layers} layers"
        parts = [f"baskets of {self.basket_size} tokens", layers, f"strength {self.strength:g}"]
        return ", ".join(parts + [form.words(v) for form, v in self._given()])

    @classmethod
    def parse(cls, spec: str) -> Calibration:
        """Parse the command-line form ``B,LAYERS,ALPHA[,NAME=VALUE...]`` (e.g. ``128,0.5,0.5``, ``512,1,1.0``,
        ``128,6+7+8,1``, ``16,1.0,1,prior=prior.json``) or ``default`` (the robust default
        ``Calibration()``, i.e. ``128,0.5,0.5``); what :meth:`spec` writes reads back to the same setting.

        ``LAYERS``: an int (last k layers), a float with a dot (fraction), or ``+``-separated explicit
        0-based indices (one index: ``5+``).  Settings (any combination, each once):
        ``prior=FILE`` (a positional prior, the JSON written by ``posfair estimate-prior``),
        ``self=RHO`` (self-attention share in [0, 1]), ``special=SHARE`` (BOS and EOS
        isolated, each given ``original``, ``equal`` or a float share), ``trailing=POLICY``
        (what a last basket shorter than B gets: ``basket``, ``merge`` or ``weighted``),
        ``schedule=SCHEDULE`` (the strength over the calibrated layers: ``flat``, ``rising`` or ``falling``);
        and the fields ``special=`` sets, one by one (``isolate_bos=true|false``, ``isolate_eos=true|false``,
        ``bos_weight=SHARE``, ``eos_weight=SHARE``), and ``queries=pool|all`` (the last three left out: the
        model's pooling decides).
        """
        if spec.strip().lower() == "default":
            return cls()
        parts = [p.strip() for p in spec.split(",")]
        head = [p for p in parts if "=" not in p]
        tail = [p for p in parts if "=" in p]
        if len(head) != 3 or parts[:3] != head:
            raise ValueError(
                f"calibration spec must be 'BASKET,LAYERS,STRENGTH' (e.g. 128,0.5,0.5), optionally followed by "
                f"{_KNOWN_SETTINGS}, or 'default'; got {spec!r}"
            )
        b, layers_s, a = head
        try:
            basket = int(b)
        except ValueError:
            raise ValueError(f"basket size in calibration spec {spec!r} must be an integer; got {b!r}") from None
        layers = parse_layers(layers_s)
        try:
            strength = float(a)
        except ValueError:
            raise ValueError(f"strength in calibration spec {spec!r} must be a number; got {a!r}") from None
        kw: dict[str, Any] = {}
        given: list[str] = []  # the spec's own names (self= is stored as self_share, special= as four fields)
        for item in tail:
            name, _, value = (x.strip() for x in item.partition("="))
            if name in given:
                raise ValueError(f"calibration spec {spec!r} gives {name}= twice")
            given.append(name)
            where = f"{name}= in calibration spec {spec!r}"
            if name == "special":
                share = _read_share(value, where)
                kw.update({f: share if "weight" in f else True for f in _SPECIAL_FIELDS})
            elif name in _FORM_BY_NAME:
                form = _FORM_BY_NAME[name]
                kw[form.field] = form.read(value, where)
            else:
                raise ValueError(f"unknown variant {name!r} in calibration spec {spec!r} (known: {_KNOWN_SETTINGS})")
        both = [n for n in given if n in _SPECIAL_FIELDS]
        if "special" in given and both:
            raise ValueError(
                f"calibration spec {spec!r} gives special= and {'= and '.join(both)}=: special= sets "
                f"{', '.join(_SPECIAL_FIELDS)} (give special= or those fields)"
            )
        return cls(basket_size=basket, layers=layers, strength=strength, **kw)

    def spec(self, prior_file: str = "PRIOR.json") -> str:
        """The command-line form of this setting, which :meth:`parse` reads back to it: ``Calibration.parse(
        c.spec(f)) == c`` when the file ``f`` holds ``c``'s prior (``prior_file`` stands for the prior's file)."""
        out = [str(self.basket_size), _layers_text(self.layers, exact=True), _number(self.strength)]
        given = dict((form.field, v) for form, v in self._given())
        special = self.special_share
        for name in _SPEC_ORDER:
            if name == "special":
                if special is not None:
                    out.append(f"special={special}")
            elif name in given and not (special is not None and name in _SPECIAL_FIELDS):
                form = _FORM_BY_FIELD[name]
                out.append(f"{form.name}={prior_file if name == 'prior' else form.text(given[name])}")
        return ",".join(out)


# -- the string forms: one row per setting beyond B,layers,alpha -------------------------------------------


def _layers_text(layers: int | float | tuple[int, ...], exact: bool = False) -> str:
    """``layers`` as written in a label (``6``, ``0.5``, ``3+4+5``) or, ``exact``, on the command line, where one
    explicit index is ``5+`` (``5`` would be the last 5 layers)."""
    if not isinstance(layers, tuple):
        return str(layers)
    return "+".join(str(i) for i in layers) + ("+" if exact and len(layers) == 1 else "")


def _number(x: float) -> str:
    """A number on the command line: ``%g`` when that reads back exactly, else every digit (``repr``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _mass_words(weight: Share) -> str:
    if weight == "original":
        return "keeps its original mass"
    if weight == "equal":
        return "gets a basket's equal share"
    return f"gets {weight:g} of the row"


def _read_share(value: str, where: str) -> Share:
    if value in ("original", "equal"):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where} must be 'original', 'equal' or a float in [0, 1); got {value!r}") from None


def _read_rho(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where} must be a number in [0, 1]; got {value!r}") from None


def _read_bool(value: str, where: str) -> bool:
    if value not in ("true", "false"):
        raise ValueError(f"{where} must be true or false; got {value!r}")
    return value == "true"


def _read_one_of(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    def read(value: str, where: str) -> str:
        if value not in allowed:
            raise ValueError(f"{where} must be {', '.join(allowed[:-1])} or {allowed[-1]}; got {value!r}")
        return value

    return read


@dataclass(frozen=True)
class _Form:
    """How one setting beyond ``B,layers,alpha`` is written in each string form of :class:`Calibration`."""

    field: str  # the Calibration field
    default: Any  # no form writes the field at this value
    label: Callable[[Any], str]  # its token in label() (``B128-L0.5-a0.5-<token>``)
    words: Callable[[Any], str]  # its phrase in describe()
    name: str  # NAME in spec()'s and parse()'s NAME=VALUE
    hint: str  # VALUE in error messages (``trailing=POLICY``)
    read: Callable[[str, str], Any]  # parse()'s reading of VALUE (the second argument names it in errors)
    text: Callable[[Any], str] = str  # spec()'s VALUE
    keyed_at_default: bool = True  # to_dict (hence key) writes it at its default (the fields older than keys)

    def at_default(self, value: Any) -> bool:
        return value is self.default or (isinstance(value, str) and value == self.default)


_WORDS_QUERIES = {"all": "every query row", "pool": "the pooling row only"}
_WORDS_TRAILING = {
    "merge": "a last basket shorter than B merged into the one before",
    "weighted": "each basket's mass in proportion to its size",
}

#: every setting beyond ``B,layers,alpha``, in the order label() and describe() write them
_FORMS: tuple[_Form, ...] = (
    _Form(
        "queries", POOLING_DECIDES, str, _WORDS_QUERIES.__getitem__, "queries", "ROWS", _read_one_of(("pool", "all"))
    ),
    _Form(
        "isolate_bos",
        POOLING_DECIDES,
        lambda v: f"bos{int(v)}",
        lambda v: f"BOS {'in its own basket' if v else 'in the first basket'}",
        "isolate_bos",
        "BOOL",
        _read_bool,
        text=lambda v: str(v).lower(),
    ),
    _Form(
        "isolate_eos",
        POOLING_DECIDES,
        lambda v: f"eos{int(v)}",
        lambda v: f"EOS {'in its own basket' if v else 'in the last basket'}",
        "isolate_eos",
        "BOOL",
        _read_bool,
        text=lambda v: str(v).lower(),
    ),
    _Form(
        "bos_weight",
        "original",
        lambda v: f"bw{v}",
        lambda v: f"BOS {_mass_words(v)}",
        "bos_weight",
        "SHARE",
        _read_share,
    ),
    _Form(
        "eos_weight", "equal", lambda v: f"ew{v}", lambda v: f"EOS {_mass_words(v)}", "eos_weight", "SHARE", _read_share
    ),
    _Form(
        "prior",
        None,
        lambda v: f"prior{v.bins}x{len(v.values)}.{v.digest()}",
        lambda v: f"each basket divided by the positional prior ({v.bins} bins)",
        "prior",
        "FILE",
        lambda value, where: load_prior(value),
        keyed_at_default=False,
    ),
    _Form(
        "self_share",
        None,
        lambda v: f"self{v:g}",
        lambda v: f"keeping {v:g} of each row's self-attention",
        "self",
        "RHO",
        _read_rho,
        text=_number,
        keyed_at_default=False,
    ),
    _Form(
        "trailing",
        "basket",
        lambda v: f"trail{v}",
        _WORDS_TRAILING.__getitem__,
        "trailing",
        "POLICY",
        _read_one_of(TRAILING),
        keyed_at_default=False,
    ),
    _Form(
        "schedule",
        "flat",
        str,
        lambda v: (
            f"the strength {v} linearly over the calibrated layers (full in the {'last' if v == 'rising' else 'first'})"
        ),
        "schedule",
        "SCHEDULE",
        _read_one_of(SCHEDULES),
        keyed_at_default=False,
    ),
)
_FORM_BY_FIELD = {form.field: form for form in _FORMS}
_FORM_BY_NAME = {form.name: form for form in _FORMS}
#: the fields ``special=SHARE`` sets (BOS and EOS isolated, both given SHARE)
_SPECIAL_FIELDS = ("isolate_bos", "isolate_eos", "bos_weight", "eos_weight")
#: the order spec() writes its settings in ("special" stands for the four fields it sets, when it can)
_SPEC_ORDER = ("prior", "self_share", "special", *_SPECIAL_FIELDS, "queries", "trailing", "schedule")
_KNOWN_SETTINGS = ", ".join(
    "special=SHARE" if n == "special" else f"{_FORM_BY_FIELD[n].name}={_FORM_BY_FIELD[n].hint}" for n in _SPEC_ORDER
)


def load_prior(path: str) -> PositionalPrior:
    """A positional prior from a JSON file: the file ``posfair estimate-prior`` writes (``{"prior": {...}, ...}``),
    a bare prior (``{"values": [...], "layers": [...]}``) or a calibration dict carrying one."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"prior file {path!r} does not exist")
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"prior file {path!r} is not valid JSON: {exc}") from None
    if isinstance(d, dict) and isinstance(d.get("calibration"), dict) and "prior" in d["calibration"]:
        d = d["calibration"]
    if isinstance(d, dict) and "prior" in d:
        d = d["prior"]
    try:
        return PositionalPrior.from_dict(d)
    except ValueError as exc:
        raise ValueError(f"prior file {path!r}: {exc}") from None


def parse_layers(text: str) -> int | float | tuple[int, ...]:
    """The CLI form of ``layers``: ``6`` (last 6), ``0.5`` (last half), ``3+4+5`` (explicit indices) or ``5+``
    (the one index 5)."""
    text = text.strip()
    try:
        if "+" in text:
            return tuple(
                int(x) for x in (text[:-1] if text.count("+") == 1 and text.endswith("+") else text).split("+")
            )
        if "." in text or "e" in text.lower():
            return float(text)
        return int(text)
    except ValueError:
        raise ValueError(
            f"layers must be an int (last k layers), a fraction like 0.5, or indices like 3+4+5; got {text!r}"
        ) from None


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
    layer_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_set", frozenset(self.layers))

    @property
    def has_variants(self) -> bool:
        """Whether a positional prior or a self-attention share is set (the fused all-rows kernel does the prior, not the share)."""
        return self.prior is not None or self.self_share is not None

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
        shared by every layer).  The one function that builds the kernels' :class:`BasketSettings`."""
        same = {f.name: getattr(self, f.name) for f in fields(BasketSettings)}
        prior = None if self.prior is None else self.prior.density(layer)
        return BasketSettings(**{**same, "strength": self.layer_strength(layer), "prior": prior})

    def basket_kwargs(self, layer: int | None = None) -> dict[str, Any]:
        """:meth:`baskets` as the keyword arguments of the basket functions (:mod:`posfair.calibration.baskets`);
        ``prior`` / ``self_share`` / ``trailing`` are included only when set (:meth:`BasketSettings.kwargs`)."""
        return self.baskets(layer).kwargs()


#: marks the fields of :class:`BasketSettings` its keyword form leaves out at their default (the variants)
_VARIANT = {"variant": True}


@dataclass(frozen=True)
class BasketSettings:
    """What the basket formula reads: one calibration in one layer, every value concrete.

    The one value the basket functions take (:func:`~posfair.calibration.baskets.calibrate_rows`,
    :func:`~posfair.calibration.baskets.calibrate_span_`, :func:`~posfair.calibration.baskets.basket_weights`,
    the fused and CUDA kernels) and that says which texts change
    (:func:`posfair.calibration.rule.row_changes`).  Built from a calibration by
    :meth:`ResolvedCalibration.baskets`; the basket functions also take its fields as keywords
    (``calibrate_rows(w, s, e, basket_size=4, strength=0.5)``), with these defaults.  ``strength`` is the
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
    prior: Sequence[float] | torch.Tensor | None = field(default=None, metadata=_VARIANT)
    self_share: float | None = field(default=None, metadata=_VARIANT)
    trailing: Trailing = field(default="basket", metadata=_VARIANT)

    def __post_init__(self) -> None:
        if self.basket_size < 1:
            raise ValueError(f"basket_size must be >= 1; got {self.basket_size}")
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1]; got {self.strength}")

    @classmethod
    def given(cls, settings: BasketSettings | None, keywords: dict[str, Any]) -> BasketSettings:
        """``settings``, or the value of the fields given as ``keywords`` (the basket functions' keyword form)."""
        if settings is None:
            return cls(**keywords)
        if keywords:
            raise TypeError(f"give BasketSettings or its fields as keywords, not both (got also {sorted(keywords)})")
        return settings

    def kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments of the basket functions; the variants (``prior``, ``self_share``,
        ``trailing``) only when set, so a default setting calls them as it always did."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("variant") and (value is None or (isinstance(value, str) and value == f.default)):
                continue
            out[f.name] = value
        return out

    @property
    def has_variants(self) -> bool:
        """Whether a positional prior or a self-attention share is set."""
        return self.prior is not None or self.self_share is not None
