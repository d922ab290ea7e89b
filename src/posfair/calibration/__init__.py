"""Attention calibration: the parameters object, the pure basket math, and its wiring into attention."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice  # noqa: F401
    from posfair.calibration.coverage import CalibrationFallbackWarning, quiet_fallback  # noqa: F401
    from posfair.calibration.params import Calibration  # noqa: F401
    from posfair.calibration.resolved import BasketSettings, ResolvedCalibration  # noqa: F401
    from posfair.calibration.setting_values import POOLING_DECIDES  # noqa: F401

_EXPORTS = {
    "MODEL_DEFAULT": ".choice",
    "STOCK": ".choice",
    "CalibrationChoice": ".choice",
    "CalibrationFallbackWarning": ".coverage",
    "quiet_fallback": ".coverage",
    "Calibration": ".params",
    "ResolvedCalibration": ".resolved",
    "BasketSettings": ".resolved",
    "POOLING_DECIDES": ".setting_values",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.calibration", _EXPORTS)
