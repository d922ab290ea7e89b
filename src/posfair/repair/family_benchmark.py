"""nDCG@10 of stock and a repair on a position-aware benchmark built from the held-out family.

The benchmark is :func:`posfair.tuning.tuner.build_corpus_benchmark`'s (section titles as queries, documents of
three consecutive sections, the relevant document the one holding the section).  Each model encodes queries
and documents as it encodes them for a user (its own calibration, if it carries one: evaluated through
:class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` with ``documents=model.calibration``); the
change is paired over queries with its bootstrap interval (:func:`posfair.stats.intervals.paired_mean_interval`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from posfair.calibration import STOCK
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.stats.intervals import paired_mean_interval
from posfair.tuning.tuner import build_corpus_benchmark

__all__ = ["TITLE_NDCG", "heldout_ndcg"]

#: the measure's name in the held-out table (a :class:`~posfair.repair.heldout.RetrievalChange` of its own)
TITLE_NDCG = "title nDCG@10"


def heldout_ndcg(stock, repaired, family_corpus: pd.DataFrame, out_dir: Path) -> dict[str, float]:
    """``{"stock", "repaired", "change", "low", "high", "queries"}``: nDCG@10 (points for the change and its 95 %
    interval) of both models on the benchmark built (once, in ``out_dir``) from ``family_corpus``."""
    bench = build_corpus_benchmark(stock, family_corpus, out_dir)
    per_query = []
    for model in (stock, repaired):
        documents = getattr(model, "calibration", STOCK)
        result = PositionalRetrievalEvaluator(bench, documents, name="", show_progress_bar=False).evaluate(model)
        per_query.append(np.asarray(result.ndcg, dtype=np.float64))
    diff = 100.0 * (per_query[1] - per_query[0])
    low, high = paired_mean_interval(diff)
    return {
        "stock": float(per_query[0].mean()),
        "repaired": float(per_query[1].mean()),
        "change": float(diff.mean()),
        "low": low,
        "high": high,
        "queries": float(len(diff)),
    }
