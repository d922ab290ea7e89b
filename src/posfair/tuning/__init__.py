"""Choosing a calibration: search basket size x layers x strength on a dev split, report the test split.

``posfair.tuning.tune(model, corpus)`` (library), :class:`CalibrationTuner` (evaluator
style), ``posfair tune`` (command line, :mod:`posfair.cli.tune`).

Modules: :mod:`.trials` (search space, trials, Pareto front, :func:`run_search`),
:mod:`.objectives` (fairness, retrieval, any function), :mod:`.tuner` (:func:`tune`,
:class:`CalibrationTuner`), :mod:`.outputs` (tables, figure, tuned model).
"""

from posfair._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    "posfair.tuning",
    {
        **dict.fromkeys(["CalibrationTuner", "make_objective", "tune"], ".tuner"),
        **dict.fromkeys(
            [
                "DEV",
                "TEST",
                "FairnessObjective",
                "FunctionObjective",
                "Objective",
                "RetrievalObjective",
                "default_fairness_settings",
                "split_ids",
            ],
            ".objectives",
        ),
        **dict.fromkeys(["save_tuned_model", "write_outputs"], ".outputs"),
        **dict.fromkeys(["SearchSpace", "Trial", "TuneResult", "pareto_front", "run_search"], ".trials"),
    },
)
