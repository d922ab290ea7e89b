"""``posfair sweep``: the papers' calibration grid and a fine strength sweep on a benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli.options import (
    Baskets,
    BatchSize,
    Benchmark,
    Cache,
    CorpusLang,
    Device,
    Domains,
    Faiss,
    GridFlag,
    Lang,
    Late,
    LateChunks,
    LayerSets,
    MaxSeqLength,
    Model,
    OutResults,
    QueryPrompt,
    Sea,
    SearchScope,
    Strengths,
    TopK,
    TrustRemoteCode,
)
from posfair.cli.parsers import integer, number


def sweep(
    benchmark: Benchmark,
    model: Model = None,
    grid: GridFlag = True,
    fine: Annotated[bool, typer.Option("--fine", help="Also a fine strength sweep (--step) at --fine-basket.")] = False,
    baskets: Baskets = (128, 256, 512),
    layers: LayerSets = (1, 0.5),
    strengths: Strengths = (0.5, 1.0),
    fine_basket: Annotated[
        int, typer.Option("--fine-basket", parser=integer(1), metavar="B", help="Basket size of the fine sweep.")
    ] = 128,
    step: Annotated[
        float,
        typer.Option(
            "--step",
            parser=number(0, 1, low_open=True),
            metavar="STRENGTH",
            help="Strength step of the fine sweep (must divide 1).",
        ),
    ] = 0.05,
    sea: Sea = False,
    late: Late = (),
    late_chunks: LateChunks = "semantic",
    lang: Lang = None,
    corpus_lang: CorpusLang = None,
    domains: Domains = (),
    query_prompt: QueryPrompt = "auto",
    out: OutResults = Path("posfair-sweep"),
    cache: Cache = None,
    batch_size: BatchSize = 32,
    top_k: TopK = 100,
    faiss: Faiss = False,
    search_scope: SearchScope = "domain",
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
) -> None:
    """Calibration sweep (the papers' grid and/or a fine strength sweep); resumable: rerun the same command."""
    from posfair.cli.checks import ModelOptions
    from posfair.cli.error_boundary import PosfairInputError, naming
    from posfair.cli.runs import BenchmarkOptions, run_benchmark

    if not grid and not fine:
        raise PosfairInputError("nothing to sweep: --no-grid without --fine")

    def calibrations() -> list:
        # the grid code lives with the pipeline (torch, transformers): imported when run_benchmark has checked the rest
        from posfair.retrieval.resumable_sweep import paper_grid, strength_sweep

        cals = paper_grid(list(baskets), list(layers), list(strengths)) if grid else []
        if fine:
            with naming("--step", step):
                cals += strength_sweep(fine_basket, list(layers), step)
        return cals

    options = BenchmarkOptions(
        benchmark=benchmark,
        model=ModelOptions(model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device),
        out=out,
        calibrations=calibrations,
        cache=cache,
        stock=True,
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
