"""Position-aware retrieval benchmarks: the published ones and one built offline.

Published benchmarks (definitions in ``docs/definitions.md``, section 4,
reproducing the reference code of Zeng et al. 2025 / PosIR):

* :func:`load_squad_posq` - SQuAD v2 (hub ``rajpurkar/squad_v2``), train +
  validation; answerable questions are the queries, every context (exact-string
  deduplicated, sorted) is the corpus; groups by first answer start.
* :func:`load_fineweb_posq` - ``NovaSearch/FineWeb-PosQ`` split train; groups
  by ``span_class``.
* :func:`load_posir` - ``infgrad/PosIR-Benchmark-v1``:
  ``<lang-Script>/<domain>/{queries.parquet, corpus.parquet, qrels/test.parquet}``;
  retrieval is per domain (each domain has its own corpus), monolingual or
  cross-lingual (queries + qrels of one language against the corpus of another).

Each loader takes a hub id (the normal path, needs the hub) or a local copy in
the published layout: a directory saved with ``datasets.save_to_disk``, a
directory of data files as on the hub, a single parquet / json(l) file, or (for
PosIR) the downloaded directory tree.  :func:`load_benchmark` takes any of them
by name, hub id or path.

:func:`build_from_corpus` builds a benchmark from any aligned corpus and saves it
in PosIR's layout (:func:`load_posir` reads it back, with extra per-segment
position groups).

Modules: :mod:`.benchmark` (the :class:`RetrievalBenchmark` object), :mod:`.sources`
(reading rows from the hub or a local copy), :mod:`.posq` (SQuAD-PosQ, FineWeb-PosQ),
:mod:`.posir` (PosIR), :mod:`.load` (:func:`load_benchmark`), :mod:`.build`
(:func:`build_from_corpus`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.retrieval.benchmarks.benchmark import (  # noqa: F401
        MIN_QUERIES_PER_GROUP,
        BenchmarkSize,
        BenchmarkSizeWarning,
        RetrievalBenchmark,
        resolution_points,
    )
    from posfair.retrieval.benchmarks.build import build_from_corpus  # noqa: F401
    from posfair.retrieval.benchmarks.load import BENCHMARK_NAMES, load_benchmark  # noqa: F401
    from posfair.retrieval.benchmarks.posir import POSIR_HUB_ID, POSIR_LANGS, load_posir, posir_lang  # noqa: F401
    from posfair.retrieval.benchmarks.posq import FINEWEB_HUB_ID, SQUAD_HUB_ID, load_fineweb_posq, load_squad_posq  # noqa: F401

_EXPORTS = {
    "MIN_QUERIES_PER_GROUP": ".benchmark",
    "BenchmarkSize": ".benchmark",
    "BenchmarkSizeWarning": ".benchmark",
    "RetrievalBenchmark": ".benchmark",
    "resolution_points": ".benchmark",
    "build_from_corpus": ".build",
    "BENCHMARK_NAMES": ".load",
    "load_benchmark": ".load",
    "POSIR_HUB_ID": ".posir",
    "POSIR_LANGS": ".posir",
    "load_posir": ".posir",
    "posir_lang": ".posir",
    "FINEWEB_HUB_ID": ".posq",
    "SQUAD_HUB_ID": ".posq",
    "load_fineweb_posq": ".posq",
    "load_squad_posq": ".posq",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.retrieval.benchmarks", _EXPORTS)
