"""posfair: measure and repair positional bias in text-embedding models."""

__version__ = "0.1.0"

__all__ = ["Calibration", "FairModel", "load_model", "__version__"]


def __getattr__(name):  # lazy: importing posfair (e.g. for ``posfair --help``) must not import numpy, torch or transformers
    if name == "Calibration":
        from posfair.calibration import Calibration

        return Calibration
    if name in ("FairModel", "load_model"):
        from posfair import model

        return getattr(model, name)
    raise AttributeError(f"module 'posfair' has no attribute {name!r}")
