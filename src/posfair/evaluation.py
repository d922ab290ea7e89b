"""What posfair's sentence-transformers evaluators share: the base class and its finishing steps.

:class:`PosfairEvaluator` is sentence-transformers' ``BaseEvaluator`` (``SentenceEvaluator``
on sentence-transformers 5.x) plus the steps every posfair evaluator ends with: the
output-file tag of a training step, the metric names prefixed with the evaluator's
name, and the metrics recorded in the model card.  The fairness audit, the retrieval
evaluation and the tuner subclass it, so they plug into ``SentenceTransformerTrainer``
and ``SequentialEvaluator`` like any built-in evaluator.
"""

from __future__ import annotations

from typing import Any

from posfair.compat import BaseEvaluator

__all__ = ["PosfairEvaluator", "run_tag"]


def run_tag(epoch: int = -1, steps: int = -1) -> str:
    """``""`` outside training, else ``_epoch{e}_steps{s}`` (for output file names)."""
    return "" if (epoch, steps) == (-1, -1) else f"_epoch{epoch}_steps{steps}"


class PosfairEvaluator(BaseEvaluator):
    """sentence-transformers' evaluator base with posfair's shared finishing steps.

    Subclasses set ``name``, ``primary_metric`` and ``greater_is_better`` and end
    ``__call__`` with ``return self.finish(model, headline, epoch, steps)``.
    """

    name: str = ""

    @staticmethod
    def run_tag(epoch: int = -1, steps: int = -1) -> str:
        return run_tag(epoch, steps)

    def finish(self, model: Any, headline: dict[str, float], epoch: int = -1, steps: int = -1) -> dict[str, float]:
        """``headline`` with each name prefixed by the evaluator's name, recorded in the model card
        (as sentence-transformers' own evaluators do); returns the prefixed metrics."""
        metrics = self.prefix_name_to_metrics(headline, self.name)
        if hasattr(model, "model_card_data"):
            self.store_metrics_in_model_card_data(model, metrics, epoch, steps)
        return metrics
