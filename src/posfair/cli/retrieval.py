"""``posfair retrieval``: a model on a position-aware benchmark, stock, calibrated and SEA.

The checks, work and summary (:func:`posfair.cli.runs.run_benchmark`) are shared with ``posfair sweep``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli.checks import ModelOptions
from posfair.cli.options import (
    BatchSize,
    Benchmark,
    Cache,
    Calibrations,
    CorpusLang,
    Device,
    Domains,
    Faiss,
    Lang,
    Late,
    LateChunks,
    MaxSeqLength,
    Model,
    OutResults,
    QueryPrompt,
    Sea,
    SearchScope,
    TopK,
    TrustRemoteCode,
)
from posfair.cli.runs import BenchmarkOptions, run_benchmark


def retrieval(
    benchmark: Benchmark,
    model: Model = None,
    calibration: Calibrations = (),
    sea: Sea = False,
    late: Late = (),
    late_chunks: LateChunks = "semantic",
    stock: Annotated[bool, typer.Option("--stock/--no-stock", help="Include the uncalibrated model.")] = True,
    lang: Lang = None,
    corpus_lang: CorpusLang = None,
    domains: Domains = (),
    query_prompt: QueryPrompt = "auto",
    out: OutResults = Path("posfair-retrieval"),
    cache: Cache = None,
    batch_size: BatchSize = 32,
    top_k: TopK = 100,
    faiss: Faiss = False,
    search_scope: SearchScope = "domain",
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
) -> None:
    """Evaluate a model on a position-aware benchmark: stock, calibrated documents, SEA, late chunking. Resumable."""
    options = BenchmarkOptions(
        benchmark=benchmark,
        model=ModelOptions(model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device),
        out=out,
        calibrations=calibration,
        cache=cache,
        stock=stock,
        sea=sea,
        late=late,
        late_chunks=late_chunks,
        query_prompt=query_prompt,
        batch_size=batch_size,
        top_k=top_k,
        faiss=faiss,
        search_scope=search_scope,
        lang=lang,
        corpus_lang=corpus_lang,
        domains=domains,
    )
    run_benchmark(options)
