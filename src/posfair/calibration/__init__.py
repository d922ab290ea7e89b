"""Attention calibration: the parameters object, the pure basket math, and its wiring into attention."""

from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice
from posfair.calibration.coverage import CalibrationFallbackWarning, quiet_fallback
from posfair.calibration.params import Calibration, ResolvedCalibration

__all__ = [
    "Calibration",
    "STOCK",
    "MODEL_DEFAULT",
    "CalibrationChoice",
    "ResolvedCalibration",
    "CalibrationFallbackWarning",
    "quiet_fallback",
]
