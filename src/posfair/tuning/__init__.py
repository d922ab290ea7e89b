"""Choosing a calibration: search basket size x layers x strength on a dev split, report the test split.

``posfair.tuning.tune(model, corpus)`` (library), :class:`CalibrationTuner` (evaluator
style), ``posfair tune`` (command line, :mod:`posfair.cli.tune`).

Modules: :mod:`.space` (:class:`SearchSpace`, :class:`Trial`), :mod:`.trials` (the search:
:func:`run_search`), :mod:`.front` (the Pareto front), :mod:`.verdicts` (the test split's
intervals and verdicts), :mod:`.result` (:class:`TuneResult`), :mod:`.objectives` (fairness,
retrieval, any function), :mod:`.tuner` (:func:`tune`, :class:`CalibrationTuner`),
:mod:`.outputs` (tables, figure, tuned model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.tuning.front import pareto_front  # noqa: F401
    from posfair.tuning.objectives import (  # noqa: F401
        DEV,
        TEST,
        FairnessObjective,
        FunctionObjective,
        Objective,
        RetrievalObjective,
        default_fairness_settings,
        split_ids,
    )
    from posfair.tuning.outputs import save_tuned_model, write_outputs  # noqa: F401
    from posfair.tuning.space import SearchSpace, Trial  # noqa: F401
    from posfair.tuning.trials import run_search  # noqa: F401
    from posfair.tuning.tune_result import TuneResult  # noqa: F401
    from posfair.tuning.tuner import CalibrationTuner, make_objective, tune  # noqa: F401

_EXPORTS = {
    "CalibrationTuner": ".tuner",
    "make_objective": ".tuner",
    "tune": ".tuner",
    "DEV": ".objectives",
    "TEST": ".objectives",
    "FairnessObjective": ".objectives",
    "FunctionObjective": ".objectives",
    "Objective": ".objectives",
    "RetrievalObjective": ".objectives",
    "default_fairness_settings": ".objectives",
    "split_ids": ".objectives",
    "save_tuned_model": ".outputs",
    "write_outputs": ".outputs",
    "SearchSpace": ".space",
    "Trial": ".space",
    "TuneResult": ".tune_result",
    "pareto_front": ".front",
    "run_search": ".trials",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.tuning", _EXPORTS)
