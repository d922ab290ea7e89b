"""What posfair's sentence-transformers-style evaluators share."""

from __future__ import annotations

from typing import Any


def run_tag(epoch: int = -1, steps: int = -1) -> str:
    """``""`` outside training, else ``_epoch{e}_steps{s}`` (for output file names)."""
    return "" if (epoch, steps) == (-1, -1) else f"_epoch{epoch}_steps{steps}"


def finish_metrics(evaluator: Any, model: Any, headline: dict[str, float], epoch: int = -1, steps: int = -1) -> dict[str, float]:
    """Prefix ``headline`` with the evaluator's name and record it in the model card, as
    sentence-transformers evaluators do; returns the prefixed metrics."""
    metrics = evaluator.prefix_name_to_metrics(headline, evaluator.name)
    if hasattr(model, "model_card_data"):
        evaluator.store_metrics_in_model_card_data(model, metrics, epoch, steps)
    return metrics
