"""Choosing a calibration: search basket size x layers x strength on a dev split, report the test split.

``posfair.tuning.tune(model, corpus)`` (library), :class:`CalibrationTuner` (evaluator
style), ``posfair tune`` (command line, :mod:`posfair.cli.tune`).

Modules: :mod:`.space` (:class:`SearchSpace`, :class:`Trial`), :mod:`.trials` (the search:
:func:`run_search`), :mod:`.front` (the Pareto front), :mod:`.verdicts` (the test split's
intervals and verdicts), :mod:`.result` (:class:`TuneResult`), :mod:`.objectives` (fairness,
retrieval, any function), :mod:`.tuner` (:func:`tune`, :class:`CalibrationTuner`),
:mod:`.outputs` (tables, figure, tuned model).
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
        **dict.fromkeys(["SearchSpace", "Trial"], ".space"),
        "TuneResult": ".result",
        "pareto_front": ".front",
        "run_search": ".trials",
    },
)
