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
(:mod:`~posfair.runtime.progress`).

Names are imported on first use, so ``import posfair.retrieval`` stays cheap (torch,
sentence-transformers and chonkie load only when needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.retrieval.benchmarks import (  # noqa: F401
        BENCHMARK_NAMES,
        RetrievalBenchmark,
        build_from_corpus,
        load_benchmark,
        load_fineweb_posq,
        load_posir,
        load_squad_posq,
    )
    from posfair.retrieval.evaluator import PositionalRetrievalEvaluator, RetrievalResult  # noqa: F401
    from posfair.retrieval.grids import paper_grid, strength_sweep  # noqa: F401
    from posfair.retrieval.late import LateChunking  # noqa: F401
    from posfair.retrieval.metrics import harmonic_mean, ndcg_at_k, psi  # noqa: F401
    from posfair.retrieval.result_tables import (  # noqa: F401
        bucket_table,
        group_table,
        plot_strength_curves,
        results_table,
        strength_figure,
    )
    from posfair.retrieval.resumable_sweep import run_sweep  # noqa: F401
    from posfair.retrieval.sea import SegmentEmbedAverage  # noqa: F401
    from posfair.retrieval.search import exact_topk  # noqa: F401

_EXPORTS = {
    "RetrievalBenchmark": ".benchmarks",
    "load_benchmark": ".benchmarks",
    "load_squad_posq": ".benchmarks",
    "load_fineweb_posq": ".benchmarks",
    "load_posir": ".benchmarks",
    "build_from_corpus": ".benchmarks",
    "BENCHMARK_NAMES": ".benchmarks",
    "PositionalRetrievalEvaluator": ".evaluator",
    "RetrievalResult": ".evaluator",
    "SegmentEmbedAverage": ".sea",
    "LateChunking": ".late",
    "run_sweep": ".resumable_sweep",
    "paper_grid": ".grids",
    "strength_sweep": ".grids",
    "group_table": ".result_tables",
    "bucket_table": ".result_tables",
    "results_table": ".result_tables",
    "strength_figure": ".result_tables",
    "plot_strength_curves": ".result_tables",
    "ndcg_at_k": ".metrics",
    "harmonic_mean": ".metrics",
    "psi": ".metrics",
    "exact_topk": ".search",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.retrieval", _EXPORTS)
