"""The search space of :func:`posfair.tuning.run_search` (:class:`SearchSpace`: basket size x layer set x strength,
the variants, trailing policies and schedules) and its evaluated points (:class:`Trial`: one configuration on one
split, as ``tune.json`` stores it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.calibration.params import SCHEDULES, TRAILING, VARIANTS, PositionalPrior
from posfair.retrieval.grids import PAPER_BASKETS, PAPER_LAYERS, PAPER_STRENGTHS
from posfair.runtime.errors import PosfairInputError

__all__ = ["SearchSpace", "Trial", "find_trial"]


def round_strength(x: float) -> float:
    return round(float(x), 6)


@dataclass(frozen=True)
class SearchSpace:
    """Basket size x layer set x strength, then ``fine_rounds`` rounds of strength bisection.

    ``layer_sets``: as :class:`~posfair.Calibration` ``layers`` (int = last k layers,
    float = fraction: 1.0 = all layers, 0.5 = the last half).  The default (3 x 2 x 2 = 12
    settings plus at most 2 per fine round) keeps ``posfair tune`` on the bundled corpus and
    model to about a quarter of an hour on 2 CPU cores; :meth:`paper` is the papers' grid.
    """

    basket_sizes: tuple[int, ...] = (16, 64, 256)
    layer_sets: tuple[Any, ...] = (0.5, 1.0)
    strengths: tuple[float, ...] = (0.5, 1.0)
    fine_rounds: int = 2
    min_step: float = 0.02
    #: the calibration variants tried at every grid point (``uniform`` = the papers' formula)
    variants: tuple[str, ...] = ("uniform",)
    #: self-attention shares rho of the ``self`` variant
    self_shares: tuple[float, ...] = (0.5, 1.0)
    #: BOS / EOS shares of the ``special`` variant ("original", "equal" or floats in [0, 1))
    special_shares: tuple[Any, ...] = ("original",)
    #: the ``prior`` variant's prior (None: estimated by the objective on the dev split when the search starts)
    prior: PositionalPrior | None = None
    #: what a short last basket gets (``Calibration.trailing``), tried at every grid point; "basket" = the papers'
    trailings: tuple[str, ...] = ("basket",)
    #: how the strength is spread over the calibrated layers (``Calibration.schedule``); "flat" = the papers'
    schedules: tuple[str, ...] = ("flat",)

    def __post_init__(self) -> None:
        if not self.basket_sizes or not self.layer_sets or not self.strengths:
            raise PosfairInputError("the search space needs at least one basket size, layer set and strength")
        bad = [s for s in self.strengths if not 0 <= float(s) <= 1]
        if bad:
            raise PosfairInputError(f"grid strengths must be in [0, 1]; got {bad}")
        if all(float(s) == 0 for s in self.strengths):
            raise PosfairInputError(
                "grid strengths must include one above 0 (strength 0 is the stock model, always evaluated)"
            )
        # strength 0 is the stock model, which every search evaluates: not a grid point of its own
        object.__setattr__(self, "strengths", tuple(s for s in self.strengths if float(s) > 0))
        if self.fine_rounds < 0:
            raise PosfairInputError(f"fine_rounds must be >= 0; got {self.fine_rounds}")
        object.__setattr__(self, "basket_sizes", tuple(dict.fromkeys(int(b) for b in self.basket_sizes)))
        object.__setattr__(self, "strengths", tuple(sorted({round_strength(s) for s in self.strengths})))
        layer_sets = [
            tuple(x) if isinstance(x, list) else x for x in self.layer_sets
        ]  # 1 (last layer) != 1.0 (all layers)
        object.__setattr__(self, "layer_sets", tuple({(type(x).__name__, x): x for x in layer_sets}.values()))
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise PosfairInputError(f"variants must be among {', '.join(VARIANTS)}; got {list(self.variants)}")
        object.__setattr__(self, "variants", tuple(dict.fromkeys(self.variants)))
        object.__setattr__(self, "self_shares", tuple(dict.fromkeys(float(x) for x in self.self_shares)))
        object.__setattr__(self, "special_shares", tuple(dict.fromkeys(self.special_shares)))
        bad = [t for t in self.trailings if t not in TRAILING]
        if bad or not self.trailings:
            raise PosfairInputError(
                f"trailing policies must be among {', '.join(TRAILING)}; got {list(self.trailings)}"
            )
        object.__setattr__(self, "trailings", tuple(dict.fromkeys(self.trailings)))
        bad = [t for t in self.schedules if t not in SCHEDULES]
        if bad or not self.schedules:
            raise PosfairInputError(
                f"strength schedules must be among {', '.join(SCHEDULES)}; got {list(self.schedules)}"
            )
        object.__setattr__(self, "schedules", tuple(dict.fromkeys(self.schedules)))
        if self.prior is not None:
            object.__setattr__(self, "prior", PositionalPrior.from_dict(self.prior))
        try:
            for rho in self.self_shares:
                Calibration(self_share=rho)
            for share in self.special_shares:
                Calibration().with_special(share)
        except ValueError as exc:
            raise PosfairInputError(str(exc)) from None
        if not any("prior" in v.split("+") for v in self.variants):
            self.coarse()  # validates every combination (with a prior: once it is known)

    @classmethod
    def paper(cls, fine_rounds: int = 2) -> SearchSpace:
        """The papers' grid (:func:`posfair.retrieval.grids.paper_grid`): {128, 256, 512} x {last layer, last 50%} x {0.5, 1.0}."""
        return cls(
            basket_sizes=PAPER_BASKETS, layer_sets=PAPER_LAYERS, strengths=PAPER_STRENGTHS, fine_rounds=fine_rounds
        )

    def expand(self, base: Calibration) -> list[Calibration]:
        """``base`` (the papers' formula) as every variant of the space; a combination (``"self+special"``) takes
        every pairing of its parts' values (each of ``self_shares`` with each of ``special_shares``)."""
        out: list[Calibration] = []
        for v in self.variants:
            parts = () if v == "uniform" else tuple(v.split("+"))
            cals = [base]
            if "prior" in parts:
                if self.prior is None:
                    raise PosfairInputError(
                        "the prior variant needs a positional prior (SearchSpace.prior, or estimated by the objective)"
                    )
                cals = [replace(c, prior=self.prior) for c in cals]
            if "self" in parts:
                cals = [replace(c, self_share=rho) for c in cals for rho in self.self_shares]
            if "special" in parts:
                cals = [c.with_special(share) for c in cals for share in self.special_shares]
            out.extend(cals)
        return out

    def coarse(self) -> list[Calibration]:
        return [
            cal
            for b in self.basket_sizes
            for layers in self.layer_sets
            for a in self.strengths
            for t in self.trailings
            for sch in self.schedules
            for cal in self.expand(Calibration(basket_size=b, layers=layers, strength=a, trailing=t, schedule=sch))
        ]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "basket_sizes": list(self.basket_sizes),
            "layer_sets": [list(x) if isinstance(x, tuple) else x for x in self.layer_sets],
            "strengths": list(self.strengths),
            "fine_rounds": self.fine_rounds,
            "min_step": self.min_step,
        }
        if self.variants != ("uniform",):  # the default space keeps its old form
            d.update(
                variants=list(self.variants),
                self_shares=list(self.self_shares),
                special_shares=list(self.special_shares),
            )
        if self.trailings != ("basket",):  # likewise
            d["trailings"] = list(self.trailings)
        if self.schedules != ("flat",):
            d["schedules"] = list(self.schedules)
        return d


def find_trial(trials: Sequence[Trial], calibration: Resolved, split: str) -> Trial:
    """The trial of ``calibration`` on ``split`` among ``trials`` (KeyError if none)."""
    key = calibration.key()
    for t in trials:
        if t.key == key and t.split == split:
            return t
    raise KeyError(f"no {split} trial of {calibration.label()}")


@dataclass
class Trial:
    """One configuration evaluated on one split."""

    calibration: Resolved
    split: str
    phase: str  # "stock", "coarse", "fine" or "test" ("skipped" for a no-op grid point, never evaluated)
    metrics: dict[str, float]
    seconds: float = 0.0
    #: fraction of the split's texts the calibration changes (None: stock, or the objective cannot tell)
    calibrated_share: float | None = None

    @property
    def label(self) -> str:
        return self.calibration.label()

    @property
    def key(self) -> str:
        return self.calibration.key()

    @property
    def stock(self) -> bool:
        return self.calibration is STOCK

    @property
    def strength(self) -> float:
        return 0.0 if self.stock else self.calibration.strength

    @property
    def line(self) -> Calibration | None:
        """The calibration with strength 0 (every field but the strength: the fine search's line); None for stock."""
        return None if self.stock else replace(self.calibration, strength=0.0)

    @property
    def variant(self) -> str:
        return STOCK.label() if self.stock else self.calibration.variant

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "key": self.key,
            "calibration": None if self.stock else self.calibration.to_dict(),
            "split": self.split,
            "phase": self.phase,
            "metrics": {k: _num(v) for k, v in self.metrics.items()},
            "seconds": self.seconds,
            "calibrated_share": self.calibrated_share,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trial:
        cal = Calibration.from_dict(d["calibration"]) if d.get("calibration") else STOCK
        metrics = {k: (float("nan") if v is None else float(v)) for k, v in d["metrics"].items()}
        share = d.get("calibrated_share")
        return cls(
            cal, d["split"], d["phase"], metrics, float(d.get("seconds", 0.0)), None if share is None else float(share)
        )


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v
