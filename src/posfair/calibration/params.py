"""The calibration parameters object.

``Calibration`` is immutable and validated on construction.  Fields left as
``None`` are resolved against a concrete model (its pooling and its number of
layers) by :meth:`Calibration.resolve`, which returns a :class:`ResolvedCalibration`
holding only concrete values.  Definitions: ``docs/definitions.md``, section 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Literal

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


#: the calibration fields whose command-line value is one of a few names (``trailing=merge``, ``schedule=rising``)
_NAMED_FIELDS: dict[str, tuple[str, ...]] = {"trailing": TRAILING, "schedule": SCHEDULES}


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
            baskets.  ``None``: CLS pooling isolates BOS; last-token pooling
            isolates BOS and EOS; mean pooling isolates nothing.
        bos_weight / eos_weight: mass given to an isolated key: ``"equal"``
            (1 / n_total, the papers' formulation), ``"original"`` (the key is
            left alone) or a float in [0, 1).
        queries: ``"pool"`` (the pooling token's row) or ``"all"`` (every valid
            row).  ``None``: "pool" for CLS / last-token pooling, "all" for mean.
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
    """

    basket_size: int = 128
    layers: int | float | tuple[int, ...] = 0.5
    strength: float = 0.5
    isolate_bos: bool | None = None
    isolate_eos: bool | None = None
    bos_weight: Share = "original"
    eos_weight: Share = "equal"
    queries: Literal["pool", "all"] | None = None
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
        for name in ("isolate_bos", "isolate_eos"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{name} must be True, False or None; got {v!r}")
        if self.queries not in (None, "pool", "all"):
            raise ValueError(f"queries must be 'pool', 'all' or None; got {self.queries!r}")
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
        if self.isolate_bos and self.isolate_eos and self.bos_weight == self.eos_weight:
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

    def isolation(self, pooling: str) -> tuple[bool, bool]:
        """``(isolate_bos, isolate_eos)`` for a model with ``pooling`` (fields left None follow the pooling)."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
        isolate_bos = self.isolate_bos if self.isolate_bos is not None else pooling in ("cls", "lasttoken")
        isolate_eos = self.isolate_eos if self.isolate_eos is not None else pooling == "lasttoken"
        return isolate_bos, isolate_eos

    def resolve(self, pooling: str, num_layers: int) -> ResolvedCalibration:
        isolate_bos, isolate_eos = self.isolation(pooling)
        queries = self.queries or ("all" if pooling == "mean" else "pool")
        layers = self.layer_indices(num_layers)
        if self.prior is not None and self.prior.layers is not None:
            missing = [i for i in layers if i not in self.prior.layers]
            if missing:
                raise ValueError(
                    f"the positional prior covers layers {list(self.prior.layers)} but the calibration also calibrates layers {missing}"
                )
        return ResolvedCalibration(
            basket_size=self.basket_size,
            layers=layers,
            strength=self.strength,
            isolate_bos=isolate_bos,
            isolate_eos=isolate_eos,
            bos_weight=self.bos_weight,
            eos_weight=self.eos_weight,
            queries=queries,
            pooling=pooling,
            prior=self.prior,
            self_share=self.self_share,
            trailing=self.trailing,
            schedule=self.schedule,
        )

    # -- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``prior``, ``self_share``, ``trailing`` and ``schedule`` only when not the default
        (so older settings keep their keys)."""
        d = asdict(self)
        if isinstance(d["layers"], tuple):
            d["layers"] = list(d["layers"])
        for name in ("prior", "self_share"):
            if d[name] is None:
                del d[name]
        if d["trailing"] == "basket":
            del d["trailing"]
        if d["schedule"] == "flat":
            del d["schedule"]
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
        """A short stable identifier (used in cache keys and file names)."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        """A human-readable label, e.g. ``B128-L0.5-a0.5``."""
        if isinstance(self.layers, tuple):
            layers = "L" + "+".join(str(i) for i in self.layers)
        else:
            layers = f"L{self.layers}"
        extra = []
        if self.queries:
            extra.append(self.queries)
        if self.isolate_bos is not None:
            extra.append(f"bos{int(self.isolate_bos)}")
        if self.isolate_eos is not None:
            extra.append(f"eos{int(self.isolate_eos)}")
        if self.bos_weight != "original":
            extra.append(f"bw{self.bos_weight}")
        if self.eos_weight != "equal":
            extra.append(f"ew{self.eos_weight}")
        if self.prior is not None:
            extra.append(f"prior{self.prior.bins}x{len(self.prior.values)}.{self.prior.digest()}")
        if self.self_share is not None:
            extra.append(f"self{self.self_share:g}")
        if self.trailing != "basket":
            extra.append(f"trail{self.trailing}")
        if self.schedule != "flat":
            extra.append(self.schedule)
        tail = ("-" + "-".join(extra)) if extra else ""
        return f"B{self.basket_size}-{layers}-a{self.strength:g}{tail}"

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
        if self.queries == "all":
            parts.append("every query row")
        elif self.queries == "pool":
            parts.append("the pooling row only")
        if self.isolate_bos is not None:
            parts.append(f"BOS {'in its own basket' if self.isolate_bos else 'in the first basket'}")
        if self.isolate_eos is not None:
            parts.append(f"EOS {'in its own basket' if self.isolate_eos else 'in the last basket'}")
        mass = {"original": "keeps its original mass", "equal": "gets a basket's equal share"}
        for name, weight, default in (("BOS", self.bos_weight, "original"), ("EOS", self.eos_weight, "equal")):
            if weight != default:
                parts.append(f"{name} {mass[weight] if isinstance(weight, str) else f'gets {weight:g} of the row'}")
        if self.prior is not None:
            parts.append(f"each basket divided by the positional prior ({self.prior.bins} bins)")
        if self.self_share is not None:
            parts.append(f"keeping {self.self_share:g} of each row's self-attention")
        if self.trailing == "merge":
            parts.append("a last basket shorter than B merged into the one before")
        elif self.trailing == "weighted":
            parts.append("each basket's mass in proportion to its size")
        if self.schedule != "flat":
            parts.append(
                f"the strength {self.schedule} linearly over the calibrated layers (full in the "
                f"{'last' if self.schedule == 'rising' else 'first'})"
            )
        return ", ".join(parts)

    @classmethod
    def parse(cls, spec: str) -> Calibration:
        """Parse the CLI form ``B,layers,alpha[,VARIANT=VALUE...]`` (e.g. ``128,0.5,0.5``, ``512,1,1.0``,
        ``128,6+7+8,1``, ``16,1.0,1,prior=prior.json``) or ``default`` (the robust default
        ``Calibration()``, i.e. ``128,0.5,0.5``).

        ``layers``: an int (last k layers), a float with a dot (fraction), or
        ``+``-separated explicit 0-based indices.  Variants (any combination):
        ``prior=FILE`` (a positional prior, the JSON written by ``posfair estimate-prior``),
        ``self=RHO`` (self-attention share in [0, 1]), ``special=SHARE`` (BOS and EOS
        isolated, each given ``original``, ``equal`` or a float share), ``trailing=POLICY``
        (what a last basket shorter than B gets: ``basket``, ``merge`` or ``weighted``),
        ``schedule=SCHEDULE`` (the strength over the calibrated layers: ``flat``, ``rising`` or ``falling``).
        """
        if spec.strip().lower() == "default":
            return cls()
        parts = [p.strip() for p in spec.split(",")]
        head = [p for p in parts if "=" not in p]
        tail = [p for p in parts if "=" in p]
        if len(head) != 3 or parts[:3] != head:
            raise ValueError(
                f"calibration spec must be 'BASKET,LAYERS,STRENGTH' (e.g. 128,0.5,0.5), optionally followed by "
                f"prior=FILE, self=RHO, special=SHARE, trailing=POLICY or schedule=SCHEDULE, or 'default'; got {spec!r}"
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
        given: set[str] = set()  # the spec's own names (self= is stored as self_share, special= as four fields)
        for item in tail:
            name, _, value = (x.strip() for x in item.partition("="))
            if name in given:
                raise ValueError(f"calibration spec {spec!r} gives {name}= twice")
            given.add(name)
            if name == "prior":
                kw["prior"] = load_prior(value)
            elif name == "self":
                try:
                    kw["self_share"] = float(value)
                except ValueError:
                    raise ValueError(
                        f"self= in calibration spec {spec!r} must be a number in [0, 1]; got {value!r}"
                    ) from None
            elif name == "special":
                share: Any = value
                if value not in ("original", "equal"):
                    try:
                        share = float(value)
                    except ValueError:
                        raise ValueError(
                            f"special= in calibration spec {spec!r} must be 'original', 'equal' or a float in [0, 1); got {value!r}"
                        ) from None
                kw.update(isolate_bos=True, isolate_eos=True, bos_weight=share, eos_weight=share)
            elif name in _NAMED_FIELDS:
                allowed = _NAMED_FIELDS[name]
                if value not in allowed:
                    raise ValueError(
                        f"{name}= in calibration spec {spec!r} must be {', '.join(allowed[:-1])} or {allowed[-1]}; "
                        f"got {value!r}"
                    )
                kw[name] = value
            else:
                raise ValueError(
                    f"unknown variant {name!r} in calibration spec {spec!r} "
                    f"(known: prior=FILE, self=RHO, special=SHARE, trailing=POLICY, schedule=SCHEDULE)"
                )
        return cls(basket_size=basket, layers=layers, strength=strength, **kw)

    def spec(self, prior_file: str = "PRIOR.json") -> str:
        """The command-line form of this setting (``prior_file`` stands for the prior's file)."""
        layers = "+".join(str(i) for i in self.layers) if isinstance(self.layers, tuple) else str(self.layers)
        out = [str(self.basket_size), layers, f"{self.strength:g}"]
        if self.prior is not None:
            out.append(f"prior={prior_file}")
        if self.self_share is not None:
            out.append(f"self={self.self_share:g}")
        if self.special_share is not None:
            out.append(f"special={self.special_share}")
        if self.trailing != "basket":
            out.append(f"trailing={self.trailing}")
        if self.schedule != "flat":
            out.append(f"schedule={self.schedule}")
        return ",".join(out)


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
    """The CLI form of ``layers``: ``6`` (last 6), ``0.5`` (last half) or ``3+4+5`` (explicit indices)."""
    text = text.strip()
    try:
        if "+" in text:
            return tuple(int(x) for x in text.split("+"))
        if "." in text:
            return float(text)
        return int(text)
    except ValueError:
        raise ValueError(
            f"layers must be an int (last k layers), a fraction like 0.5, or indices like 3+4+5; got {text!r}"
        ) from None


@dataclass(frozen=True)
class ResolvedCalibration:
    """A :class:`Calibration` made concrete for one model."""

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

    def basket_kwargs(self, layer: int | None = None) -> dict[str, Any]:
        """The keyword arguments of the basket functions (:mod:`posfair.calibration.baskets`) for this calibration
        in layer ``layer`` (needed when the positional prior is per layer).  ``prior`` / ``self_share`` /
        ``trailing`` are included only when set (not the default), so a default setting calls the basket
        functions exactly as before."""
        kw: dict[str, Any] = dict(
            basket_size=self.basket_size,
            strength=self.layer_strength(layer),
            isolate_bos=self.isolate_bos,
            isolate_eos=self.isolate_eos,
            bos_weight=self.bos_weight,
            eos_weight=self.eos_weight,
        )
        if self.prior is not None:
            kw["prior"] = self.prior.density(layer)
        if self.self_share is not None:
            kw["self_share"] = self.self_share
        if self.trailing != "basket":
            kw["trailing"] = self.trailing
        return kw
