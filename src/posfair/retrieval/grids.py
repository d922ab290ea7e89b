"""The calibration grids of the papers (Michail et al. 2026): the one definition of each.

:func:`paper_grid` is the grid of Tables 1 and 2 (basket size x layer set x strength);
:func:`strength_sweep` the fine strength series of Figure 3.  The retrieval sweep
(:func:`posfair.retrieval.resumable_sweep.run_sweep`) and the tuner's
:meth:`posfair.tuning.SearchSpace.paper` both take their values from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posfair.calibration import Calibration

__all__ = ["PAPER_BASKETS", "PAPER_LAYERS", "PAPER_STRENGTHS", "paper_grid", "strength_sweep"]

PAPER_BASKETS: tuple[int, ...] = (128, 256, 512)
PAPER_LAYERS: tuple[Any, ...] = (1, 0.5)  # last layer, last 50% of layers
PAPER_STRENGTHS: tuple[float, ...] = (0.5, 1.0)


def paper_grid(
    basket_sizes: Sequence[int] = PAPER_BASKETS,
    layer_sets: Sequence[Any] = PAPER_LAYERS,
    strengths: Sequence[float] = PAPER_STRENGTHS,
) -> list[Calibration]:
    """Basket size x layer set x strength (paper: {128, 256, 512} x {last, last 50%} x {0.5, 1.0})."""
    return [
        Calibration(basket_size=b, layers=layers, strength=a)
        for layers in layer_sets
        for a in strengths
        for b in basket_sizes
    ]


def strength_sweep(
    basket_size: int = 128, layer_sets: Sequence[Any] = PAPER_LAYERS, step: float = 0.05
) -> list[Calibration]:
    """Strengths step, 2 step, ..., 1 for each layer set (strength 0 is the stock run)."""
    if not 0 < step <= 1:
        raise ValueError(f"step must be in (0, 1]; got {step}")
    n = int(round(1 / step))
    if not np.isclose(n * step, 1.0):
        raise ValueError(f"step must divide 1 (e.g. 0.05, 0.1, 0.25); got {step}")
    return [
        Calibration(basket_size=basket_size, layers=layers, strength=round(i * step, 10))
        for layers in layer_sets
        for i in range(1, n + 1)
    ]
