"""posfair: measure and repair positional bias in text-embedding models."""

from posfair.calibration import Calibration

__version__ = "0.1.0"

__all__ = ["Calibration", "FairModel", "load_model", "__version__"]


def __getattr__(name):  # lazy: importing posfair must not import torch/transformers eagerly
    if name in ("FairModel", "load_model"):
        from posfair import model

        return getattr(model, name)
    raise AttributeError(f"module 'posfair' has no attribute {name!r}")
