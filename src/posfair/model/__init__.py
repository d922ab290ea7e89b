"""The model layer: the encoder users call and everything posfair reads off or wires into a model.

- :mod:`posfair.model.fair_model` -- :func:`load_model` and :class:`FairModel` (a
  sentence-transformers ``SentenceTransformer`` whose ``encode`` takes ``calibration``);
- :mod:`posfair.model.calibrated_transformer` -- :class:`CalibratedTransformer`, the input module that
  switches the model's attention to posfair's backend and stores a default calibration;
- :mod:`posfair.model.stock_layers` -- the stock layers below the first calibrated layer, computed once;
- :mod:`posfair.model.info` -- token limits and the content fingerprint a cache is keyed by;
- :mod:`posfair.model.hub` -- where a model comes from, checked before loading;
- :mod:`posfair.model.compat` -- where the two supported stacks (transformers 4.x / 5.x) differ; a leaf that
  imports nothing from posfair.

Which attention route calibrates which architecture on which stack is the table of backends,
:mod:`posfair.calibration.backends` (the calibration routes read it; this layer dispatches by it).

Importing this package is light: the names below are imported from their module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.model.calibrated_transformer import CalibratedTransformer  # noqa: F401
    from posfair.model.fair_model import (  # noqa: F401
        BUNDLED_MODEL_NAME,
        FairModel,
        bundled_model_path,
        input_reported,
        load_model,
    )
    from posfair.model.info import display_name, model_fingerprint, position_limit, token_limit  # noqa: F401

_EXPORTS = {
    "load_model": ".fair_model",
    "FairModel": ".fair_model",
    "bundled_model_path": ".fair_model",
    "BUNDLED_MODEL_NAME": ".fair_model",
    "input_reported": ".fair_model",
    "CalibratedTransformer": ".calibrated_transformer",
    "model_fingerprint": ".info",
    "position_limit": ".info",
    "token_limit": ".info",
    "display_name": ".info",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.model", _EXPORTS)
