"""What posfair's sentence-transformers evaluators share: the base class and its finishing steps.

:class:`PosfairEvaluator` is sentence-transformers' ``BaseEvaluator`` (``SentenceEvaluator``
on sentence-transformers 5.x) plus the steps every posfair evaluator ends with: the
output-file tag of a training step, the metric names prefixed with the evaluator's
name, and the metrics recorded in the model card.  The fairness audit, the retrieval
evaluation and the tuner subclass it, so they plug into ``SentenceTransformerTrainer``
and ``SequentialEvaluator`` like any built-in evaluator.

The contract (what sentence-transformers and its trainer rely on):

- ``evaluator(model, output_path=None, epoch=-1, steps=-1)`` returns a dict of floats
  whose keys are ``f"{name}_{metric}"`` (bare metric names when ``name`` is ``""``);
- ``primary_metric`` is one of those keys, already prefixed before the first call (so
  ``metric_for_best_model=evaluator.primary_metric`` can be set before training; the
  trainer logs it as ``eval_{primary_metric}``), and it follows ``name`` if that changes;
- ``greater_is_better`` says which way the primary metric improves;
- evaluators hash and compare by identity (the model card keys its results by evaluator).
"""

from __future__ import annotations

from typing import Any

from posfair.model.compat import BaseEvaluator
from posfair.runtime.errors import PosfairInputError

__all__ = ["PosfairEvaluator", "metric_name_part", "run_tag"]


def run_tag(epoch: float = -1, steps: int = -1) -> str:
    """``""`` outside training, else ``_epoch{e}_steps{s}`` (for output file names).

    The trainer passes fractional epochs (``0.6666…`` after two thirds of one); they are
    written with two decimals, whole ones as integers.
    """
    if (epoch, steps) == (-1, -1):
        return ""
    e = int(epoch) if float(epoch).is_integer() else f"{float(epoch):.2f}"
    return f"_epoch{e}_steps{steps}"


def metric_name_part(text: str) -> str:
    """``text`` usable inside a metric name or file name: anything but alphanumerics, ``-`` and ``.``
    becomes ``_`` (runs of ``_`` collapse, none at either end)."""
    out = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in text)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_")


class PosfairEvaluator(BaseEvaluator):
    """sentence-transformers' evaluator base with posfair's shared finishing steps.

    Subclasses set ``name``, the unprefixed metric ``self.base_metric`` (``primary_metric`` is
    derived from it) and ``greater_is_better``, and end ``__call__`` with
    ``return self.finish(model, headline, epoch, steps)``.
    """

    name: str = ""
    #: the primary metric without the evaluator's name (None: not set)
    base_metric: str | None = None

    @property
    def primary_metric(self) -> str | None:
        """The key of the primary metric in what ``__call__`` returns: ``f"{name}_{metric}"``."""
        if self.base_metric is None:
            return None
        return f"{self.name}_{self.base_metric}" if self.name else self.base_metric

    @primary_metric.setter
    def primary_metric(self, value: str | None) -> None:
        # sentence-transformers assigns None in BaseEvaluator.__init__ and, in prefix_name_to_metrics,
        # the prefixed key; keep the metric itself so that the key always follows ``name``
        if value is not None and self.name and value.startswith(f"{self.name}_"):
            value = value[len(self.name) + 1 :]
        self.base_metric = value

    def _check_name(self, name: Any) -> str:
        if not isinstance(name, str):
            raise PosfairInputError(f"the evaluator name must be a string; got {type(name).__name__} {name!r}")
        return name

    @staticmethod
    def run_tag(epoch: float = -1, steps: int = -1) -> str:
        return run_tag(epoch, steps)

    def finish(self, model: Any, headline: dict[str, float], epoch: float = -1, steps: int = -1) -> dict[str, float]:
        """``headline`` with each name prefixed by the evaluator's name, recorded in the model card
        (as sentence-transformers' own evaluators do); returns the prefixed metrics."""
        metrics = self.prefix_name_to_metrics(headline, self.name)
        if hasattr(model, "model_card_data"):
            self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
        return metrics
