"""Choosing a calibration: search basket size x layers x strength on a dev split, report the test split.

``posfair.tuning.tune(model, corpus)`` (library), :class:`CalibrationTuner` (evaluator
style), ``posfair tune`` (command line, :mod:`posfair.cli.tune`).
"""

from posfair.tuning.evaluator import CalibrationTuner, make_objective, tune
from posfair.tuning.report import save_tuned_model, write_outputs
from posfair.tuning.tuner import (
    DEV,
    TEST,
    FairnessObjective,
    FunctionObjective,
    Objective,
    RetrievalObjective,
    SearchSpace,
    Trial,
    TuneResult,
    pareto_front,
    run_search,
)

__all__ = [
    "tune", "CalibrationTuner", "make_objective", "save_tuned_model", "write_outputs", "DEV", "TEST", "FairnessObjective",
    "FunctionObjective", "Objective", "RetrievalObjective", "SearchSpace", "Trial", "TuneResult", "pareto_front", "run_search",
]  # fmt: skip
