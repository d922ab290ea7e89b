"""posfair: measure and repair positional bias in text-embedding models.

Importing posfair is light (no torch, no transformers); it arranges for posfair's
attention functions to be registered with transformers as soon as transformers'
modelling code is imported, so a calibrated folder saved by posfair loads calibrated
with plain ``SentenceTransformer(path)`` or ``AutoModel.from_pretrained(path)``.
"""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING

from posfair.calibration import backends as _backends
from posfair.runtime.lazy import lazy_exports
from posfair.runtime.post_import import when_imported

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.attention import attention_profile, estimate_prior  # noqa: F401
    from posfair.calibration import MODEL_DEFAULT, STOCK, Calibration, CalibrationFallbackWarning  # noqa: F401
    from posfair.corpus import load_corpus  # noqa: F401
    from posfair.fairness import AuditResult, AuditSettings, LanguageConfig, PositionalFairnessEvaluator, audit  # noqa: F401
    from posfair.model import FairModel, load_model  # noqa: F401
    from posfair.retrieval import (  # noqa: F401
        PositionalRetrievalEvaluator,
        RetrievalResult,
        build_from_corpus,
        load_benchmark,
        run_sweep,
    )
    from posfair.tuning import CalibrationTuner, tune  # noqa: F401

try:  # the installed package's metadata (pyproject.toml's version): the one place the version is written
    __version__ = _metadata.version("posfair")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: the entry points, imported on first use (``from posfair import audit``); each area's package exports more
_EXPORTS = {
    # the model and calibration
    "load_model": "posfair.model",
    "FairModel": "posfair.model",
    "Calibration": "posfair.calibration",
    "STOCK": "posfair.calibration",
    "MODEL_DEFAULT": "posfair.calibration",
    "CalibrationFallbackWarning": "posfair.calibration",
    "estimate_prior": "posfair.attention",
    # the positional-fairness audit
    "audit": "posfair.fairness",
    "AuditSettings": "posfair.fairness",
    "AuditResult": "posfair.fairness",
    "LanguageConfig": "posfair.fairness",
    "PositionalFairnessEvaluator": "posfair.fairness",
    "attention_profile": "posfair.attention",
    # position-aware retrieval evaluation
    "PositionalRetrievalEvaluator": "posfair.retrieval",
    "RetrievalResult": "posfair.retrieval",
    "load_benchmark": "posfair.retrieval",
    "build_from_corpus": "posfair.retrieval",
    "run_sweep": "posfair.retrieval",
    # choosing a calibration
    "tune": "posfair.tuning",
    "CalibrationTuner": "posfair.tuning",
    # data
    "load_corpus": "posfair.corpus",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair", _EXPORTS)
__all__ = [*__all__, "__version__"]


# posfair's attention reaches transformers as soon as transformers' modelling code is imported, whoever imports
# it: the table of backends says which modules, once imported, run which route's hook (the registry's
# registration; on transformers 4.x, the BERT family's attention tables); hooked here, before anything imports them
_backends.install_import_hooks(when_imported)
