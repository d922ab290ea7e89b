"""The positional prior: the model's mean attention mass over relative position (:class:`PositionalPrior`), by
which positional-prior calibration divides, and :func:`load_prior`, which reads one from the JSON file
``posfair estimate-prior`` writes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any


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
    Estimate one with :func:`posfair.attention.prior_estimate.estimate_prior`.
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
