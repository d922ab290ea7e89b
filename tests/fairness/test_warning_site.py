"""The audit's warnings point at the line that called posfair (issue 40 item 5)."""

from __future__ import annotations

import warnings

from posfair import Calibration
from posfair.calibration.coverage import CalibrationFallbackWarning


def _recorded(call, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(*args)
    return caught


def test_the_evaluators_warning_points_at_the_callers_line(tiny_model, make_corpus):
    """The audit's calibration warning, raised inside PositionalFairnessEvaluator -> audit, names the line that called
    the evaluator (on main it named posfair/fairness/pipeline.py)."""
    from posfair.fairness.experiment import AuditSettings
    from posfair.fairness.pipeline import PositionalFairnessEvaluator

    settings = AuditSettings(
        n_values=(3,), configs=("en",), target_docs=12, min_segment_tokens=1, max_segment_tokens=60, batch_size=4
    )
    noop = Calibration(basket_size=4096, layers=1, strength=1.0)  # longer than any document: every text stock
    evaluator = PositionalFairnessEvaluator(make_corpus(topics=8), settings, noop, write_report=False)
    caught = _recorded(evaluator, tiny_model("bert-mean"))
    fallback = [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
    assert fallback and {w.filename for w in fallback} == {__file__}
