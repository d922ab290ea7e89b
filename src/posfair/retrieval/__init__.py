"""posfair.retrieval: position-aware retrieval evaluation.

Benchmarks (:mod:`~posfair.retrieval.benchmarks`): SQuAD-PosQ, FineWeb-PosQ,
PosIR (hub ids or local copies in the published layouts) and benchmarks built
offline from an aligned corpus (saved in PosIR's layout).  Evaluation
(:class:`PositionalRetrievalEvaluator`): documents encoded stock / calibrated /
with Segment Embed Average, queries stock; exact search; nDCG@10 per positional
group, Harm, PSI, PosIR per-length-bucket PSI.  Sweeps (:func:`run_sweep`) are
cached and resumable; tables in the layouts of the paper's Tables 1 and 2.

Heavy imports (torch, sentence-transformers, chonkie) happen on first use.
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
    "PositionalRetrievalEvaluator": "evaluator",
    "RetrievalResult": "evaluator",
    "SegmentEmbedAverage": "sea",
    "run_sweep": "sweep",
    "paper_grid": "sweep",
    "strength_sweep": "sweep",
    "group_table": "tables",
    "bucket_table": "tables",
    "write_table": "tables",
    "plot_strength_curves": "tables",
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
