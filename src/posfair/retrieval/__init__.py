"""posfair.retrieval: position-aware retrieval evaluation.

Benchmarks (the :mod:`~posfair.retrieval.benchmarks` package): SQuAD-PosQ, FineWeb-PosQ,
PosIR (hub ids or local copies in the published layouts) and benchmarks built
offline from an aligned corpus (saved in PosIR's layout).  Evaluation
(:class:`PositionalRetrievalEvaluator`): documents encoded stock / calibrated /
with Segment Embed Average, queries stock; exact search; nDCG@10 per positional
group, Harm, PSI, PosIR per-length-bucket PSI.  Sweeps (:func:`run_sweep`) over the
paper's grids (:mod:`~posfair.retrieval.grids`) are cached and resumable; tables in the
layouts of the paper's Tables 1 and 2 (:mod:`~posfair.retrieval.result_tables`, written through
:mod:`posfair.report.tables`).  Long calls show tqdm bars or call a ``progress`` callback
(:mod:`~posfair.progress`).

Names are imported on first use, so ``import posfair.retrieval`` stays cheap (torch,
sentence-transformers and chonkie load only when needed).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RetrievalBenchmark": "benchmarks",
    "load_benchmark": "benchmarks",
    "load_squad_posq": "benchmarks",
    "load_fineweb_posq": "benchmarks",
    "load_posir": "benchmarks",
    "build_from_corpus": "benchmarks",
    "BENCHMARK_NAMES": "benchmarks",
    "PositionalRetrievalEvaluator": "evaluator",
    "RetrievalResult": "evaluator",
    "SegmentEmbedAverage": "sea",
    "LateChunking": "late",
    "run_sweep": "sweep",
    "paper_grid": "grids",
    "strength_sweep": "grids",
    "group_table": "result_tables",
    "bucket_table": "result_tables",
    "results_table": "result_tables",
    "strength_figure": "result_tables",
    "plot_strength_curves": "result_tables",
    "ndcg_at_k": "metrics",
    "harmonic_mean": "metrics",
    "psi": "metrics",
    "exact_topk": "search",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"posfair.retrieval.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'posfair.retrieval' has no attribute {name!r}")
