"""``posfair retrieval``: a model on a position-aware benchmark, stock, calibrated and SEA.

:func:`run_benchmark` (checks, work and summary) is shared with ``posfair sweep``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli import checks
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
from posfair.errors import install_hint


def query_prompt(text: str) -> str | None:
    """``--query-prompt``: ``auto``, ``none`` or a string in which ``\\n`` and other escapes are read."""
    from posfair.cli.errors import input_error

    if text.lower() == "none":
        return None
    if text == "auto":
        return "auto"
    try:
        return text.encode().decode("unicode_escape")
    except UnicodeDecodeError as exc:
        raise input_error("--query-prompt", repr(text), f"bad escape ({exc.reason})") from None


def _say_size(bench) -> None:
    """The benchmark's size and resolution, and a warning when it is too small to separate methods."""
    import warnings

    from posfair.cli.progress import console
    from posfair.retrieval.benchmarks import BenchmarkSizeWarning

    size = bench.size()
    console().print(size.line(), markup=False, highlight=False)
    message = size.warning("build a larger one (posfair build-benchmark --help)")
    if message:
        warnings.warn(message, BenchmarkSizeWarning, stacklevel=1)


def run_benchmark(
    *,
    model,
    benchmark,
    calibrations,
    out,
    cache,
    sea,
    stock,
    prompt,
    batch_size,
    top_k,
    faiss,
    search_scope="domain",
    max_seq_length,
    trust_remote_code,
    device,
    lang,
    corpus_lang,
    domains,
    late=(),
    late_chunks="semantic",
) -> None:
    """Check everything, load the benchmark and the model, run every setting (resumable), print the tables.

    ``calibrations``: a list, or a function making it (called after the checks: ``sweep`` builds its grid with the pipeline's code).
    """
    from posfair.cli.errors import PosfairInputError, naming

    if not stock and not calibrations and not sea and not late:
        raise PosfairInputError("nothing to evaluate: --no-stock without --calibration, --sea or --late")
    if late_chunks != "semantic" and not late:
        raise PosfairInputError(f"--late-chunks {late_chunks}: applies only with --late max,mean")
    if out is not None:
        checks.output_folder(out)
    checks.cache_folder(cache)
    checks.benchmark_source(benchmark)
    if sea:
        checks.installed("chonkie", "--sea", install_hint("retrieval"))
    if late and late_chunks == "semantic":
        checks.installed("chonkie", "--late with --late-chunks semantic", install_hint("retrieval"))
    if faiss:
        checks.installed("faiss", "--faiss", "pip install faiss-cpu")
    prompt = query_prompt(prompt)
    model_id = checks.model_source(model, trust_remote_code=trust_remote_code)
    checks.device(device)
    # the pipeline (torch, transformers) is imported only now, after the checks (--help and mistakes stay fast)

    from posfair.calibration.coverage import NOOP_LABEL
    from posfair.cli.progress import console, progress_bars
    from posfair.cli.tables import print_frame
    from posfair.retrieval.benchmarks import load_benchmark
    from posfair.retrieval.compare import differences_table
    from posfair.retrieval.late import LateChunking
    from posfair.retrieval.result_tables import bucket_table, group_table, results_table
    from posfair.retrieval.sea import SegmentEmbedAverage
    from posfair.retrieval.sweep import BUCKETS_TITLE, GROUPS_TITLE, noop_settings, run_sweep
    from posfair.store import EmbeddingStore

    calibrations = calibrations() if callable(calibrations) else list(calibrations)
    with naming("--benchmark", benchmark):
        bench = load_benchmark(benchmark, lang=lang, corpus_lang=corpus_lang, domains=list(domains) or None)
    _say_size(bench)
    fm = checks.load_model(model_id, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device)
    checks.check_calibrations(fm, calibrations)
    with progress_bars() as bar:
        results = run_sweep(
            fm,
            bench,
            calibrations,
            out,
            include_stock=stock,
            sea=SegmentEmbedAverage(batch_size=batch_size) if sea else None,
            late=LateChunking.variants(late, late_chunks, batch_size=batch_size) if late else (),
            store=EmbeddingStore(cache) if cache else None,
            query_prompt=prompt,
            batch_size=batch_size,
            top_k=top_k,
            use_faiss=faiss,
            progress=bar,
            search_scope=search_scope,
        )
    con = console()
    legend: list[str] = []
    for build, present in (
        (group_table, any(r.groups for r in results)),
        (bucket_table, any(r.buckets for r in results)),
    ):
        if present:
            title = (GROUPS_TITLE if build is group_table else BUCKETS_TITLE).format(benchmark=results[0].benchmark)
            table = results_table(build(results))
            print_frame(con, title, table.frame)
            legend += [line for line in table.caption.splitlines() if line not in legend]
    if legend:  # once for both tables (the files' tables carry it each)
        con.print("\n".join(legend), markup=False, highlight=False, soft_wrap=True)
    differences = differences_table(results)
    if differences is not None:
        print_frame(con, differences.title, differences.frame, caption=differences.caption)
    noop = noop_settings(results)
    if noop:
        n_cal = sum(r.method == "calibrated" for r in results)
        con.print(
            f"{len(noop)} of {n_cal} calibrations change no document of this benchmark ({NOOP_LABEL}; every document is shorter "
            f"than one basket or exactly one basket) and were not evaluated: {', '.join(noop)}",
            markup=False,
            highlight=False,
        )
    con.print(f"results in {out}", markup=False, highlight=False)


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
    run_benchmark(
        model=model,
        benchmark=benchmark,
        calibrations=calibration,
        out=out,
        cache=cache,
        sea=sea,
        stock=stock,
        late=late,
        late_chunks=late_chunks,
        prompt=query_prompt,
        batch_size=batch_size,
        top_k=top_k,
        faiss=faiss,
        search_scope=search_scope,
        max_seq_length=max_seq_length,
        trust_remote_code=trust_remote_code,
        device=device,
        lang=lang,
        corpus_lang=corpus_lang,
        domains=domains,
    )
