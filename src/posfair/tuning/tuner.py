"""Former home of the tuner, split into :mod:`posfair.tuning.search` (search space, trials,
Pareto front, :func:`run_search`) and :mod:`posfair.tuning.objectives` (what is optimised).

Kept so that ``from posfair.tuning.tuner import ...`` keeps working; new code imports
from :mod:`posfair.tuning`.
"""

from posfair.tuning.objectives import (
    DEV,
    STOCK,
    TEST,
    FairnessObjective,
    FunctionObjective,
    Objective,
    RetrievalObjective,
    default_fairness_settings,
    split_ids,
)
from posfair.tuning.search import RESULTS_FILE, SearchSpace, Trial, TuneResult, pareto_front, run_search

__all__ = [
    "SearchSpace",
    "Trial",
    "TuneResult",
    "Objective",
    "FunctionObjective",
    "FairnessObjective",
    "RetrievalObjective",
    "run_search",
    "pareto_front",
    "split_ids",
    "default_fairness_settings",
    "DEV",
    "TEST",
    "STOCK",
    "RESULTS_FILE",
]
