"""How the retrieval code calls ``encode``: stock vs calibrated."""

from __future__ import annotations

import inspect
from typing import Any

from posfair.calibration import Calibration

__all__ = ["stock_kwargs"]


def stock_kwargs(model: Any, calibration: Calibration | None = None) -> dict[str, Any]:
    """The ``encode`` keyword selecting ``calibration`` - or, for None, the stock model even when
    the model carries a default calibration (posfair models take ``calibration=False``)."""
    if "calibration" in inspect.signature(model.encode).parameters:
        return {"calibration": calibration if calibration is not None else False}
    if calibration is not None:
        raise TypeError(f"{type(model).__name__}.encode takes no calibration: load the model with posfair.load_model()")
    return {}
