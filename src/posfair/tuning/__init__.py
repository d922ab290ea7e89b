"""Choosing a calibration: search basket size x layers x strength on a dev split, report the test split.

``posfair.tuning.tune(model, corpus)`` (library), :class:`CalibrationTuner` (evaluator
style), ``posfair tune`` (command line, :mod:`posfair.cli.tune`).

Modules: :mod:`.search` (search space, trials, Pareto front, :func:`run_search`),
:mod:`.objectives` (fairness, retrieval, any function), :mod:`.evaluator` (:func:`tune`,
:class:`CalibrationTuner`), :mod:`.report` (tables, figure, tuned model).
"""

from posfair.tuning.evaluator import CalibrationTuner, make_objective, tune
from posfair.tuning.objectives import (
    DEV,
    TEST,
    FairnessObjective,
    FunctionObjective,
    Objective,
    RetrievalObjective,
    default_fairness_settings,
    split_ids,
)
from posfair.tuning.report import save_tuned_model, write_outputs
from posfair.tuning.search import SearchSpace, Trial, TuneResult, pareto_front, run_search

__all__ = [
    "tune", "CalibrationTuner", "make_objective", "save_tuned_model", "write_outputs", "DEV", "TEST", "FairnessObjective",
    "FunctionObjective", "Objective", "RetrievalObjective", "SearchSpace", "Trial", "TuneResult", "pareto_front", "run_search",
    "default_fairness_settings", "split_ids",
]  # fmt: skip
