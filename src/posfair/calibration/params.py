"""The calibration parameters object.

``Calibration`` is immutable and validated on construction.  Fields left as
``None`` are resolved against a concrete model (its pooling and its number of
layers) by :meth:`Calibration.resolve`, which returns a :class:`ResolvedCalibration`
holding only concrete values.  See ``shared/specs/calibration.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from typing import Any, Literal

Share = Literal["equal", "original"] | float
Pooling = Literal["cls", "mean", "lasttoken"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "lasttoken")


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
    """

    basket_size: int = 128
    layers: int | float | tuple[int, ...] = 0.5
    strength: float = 0.5
    isolate_bos: bool | None = None
    isolate_eos: bool | None = None
    bos_weight: Share = "original"
    eos_weight: Share = "equal"
    queries: Literal["pool", "all"] | None = None

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
            raise ValueError(f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}")
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
            raise ValueError(f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}")
        object.__setattr__(self, "layers", layers)

        object.__setattr__(self, "bos_weight", _check_share("bos_weight", self.bos_weight))
        object.__setattr__(self, "eos_weight", _check_share("eos_weight", self.eos_weight))
        fixed = sum(w for w in (self.bos_weight, self.eos_weight) if isinstance(w, float))
        if fixed >= 1.0:
            raise ValueError(f"bos_weight + eos_weight = {fixed} leaves no attention mass for the content baskets; their sum must be < 1")
        for name in ("isolate_bos", "isolate_eos"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{name} must be True, False or None; got {v!r}")
        if self.queries not in (None, "pool", "all"):
            raise ValueError(f"queries must be 'pool', 'all' or None; got {self.queries!r}")

    # -- resolution against a model ---------------------------------------------------------
    def layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The 0-based indices of the calibrated layers for a model with ``num_layers`` layers."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}")
        if isinstance(self.layers, tuple):
            bad = [i for i in self.layers if i >= num_layers]
            if bad:
                raise ValueError(f"layers {bad} out of range: the model has {num_layers} layers (valid indices 0..{num_layers - 1})")
            return self.layers
        if isinstance(self.layers, int):
            if self.layers > num_layers:
                raise ValueError(f"layers={self.layers} asks for the last {self.layers} layers, but the model has only {num_layers}")
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
        return ResolvedCalibration(
            basket_size=self.basket_size,
            layers=self.layer_indices(num_layers),
            strength=self.strength,
            isolate_bos=isolate_bos,
            isolate_eos=isolate_eos,
            bos_weight=self.bos_weight,
            eos_weight=self.eos_weight,
            queries=queries,
            pooling=pooling,
        )

    # -- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if isinstance(d["layers"], tuple):
            d["layers"] = list(d["layers"])
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
        tail = ("-" + "-".join(extra)) if extra else ""
        return f"B{self.basket_size}-{layers}-a{self.strength:g}{tail}"

    @classmethod
    def parse(cls, spec: str) -> Calibration:
        """Parse the CLI form ``B,layers,alpha`` (e.g. ``128,0.5,0.5``, ``512,1,1.0``, ``128,6+7+8,1``)
        or ``default`` (the robust default ``Calibration()``, i.e. ``128,0.5,0.5``).

        ``layers``: an int (last k layers), a float with a dot (fraction), or
        ``+``-separated explicit 0-based indices.
        """
        if spec.strip().lower() == "default":
            return cls()
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 3:
            raise ValueError(f"calibration spec must be 'BASKET,LAYERS,STRENGTH' (e.g. 128,0.5,0.5) or 'default'; got {spec!r}")
        b, layers_s, a = parts
        try:
            basket = int(b)
        except ValueError:
            raise ValueError(f"basket size in calibration spec {spec!r} must be an integer; got {b!r}") from None
        layers = parse_layers(layers_s)
        try:
            strength = float(a)
        except ValueError:
            raise ValueError(f"strength in calibration spec {spec!r} must be a number; got {a!r}") from None
        return cls(basket_size=basket, layers=layers, strength=strength)


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
        raise ValueError(f"layers must be an int (last k layers), a fraction like 0.5, or indices like 3+4+5; got {text!r}") from None


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
    layer_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_set", frozenset(self.layers))

    def basket_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the basket functions (:mod:`posfair.calibration.baskets`) for this calibration."""
        return dict(
            basket_size=self.basket_size,
            strength=self.strength,
            isolate_bos=self.isolate_bos,
            isolate_eos=self.isolate_eos,
            bos_weight=self.bos_weight,
            eos_weight=self.eos_weight,
        )
