"""``posfair embed``: every distinct text of a corpus into an embedding store, in this process or on Ray."""

from __future__ import annotations

from typing import Annotated

import typer

from posfair.cli import checks
from posfair.cli.options import (
    BasketSize,
    BatchSize,
    CalibrationLayers,
    CalibrationOption,
    CorpusOrBenchmark,
    Device,
    Langs,
    MaxBatchTokens,
    MaxSeqLength,
    Model,
    OutStore,
    Pooling,
    Prompt,
    Strength,
    TextField,
    TrustRemoteCode,
    Unit,
)
from posfair.cli.parsers import choice, integer

Part = Annotated[
    str | None,
    typer.Option(
        "--part",
        parser=choice("documents", "queries"),
        metavar="documents|queries",
        help="Treat --corpus as a retrieval benchmark (a name such as posir or squad-posq, a hub id or a folder) and embed its documents or queries.",
    ),
]
ShardSize = Annotated[
    int,
    typer.Option(
        "--shard-size",
        parser=integer(1),
        metavar="N",
        help="Distinct texts per shard (a killed run loses at most the shards in flight).",
    ),
]
Batching = Annotated[
    str,
    typer.Option(
        "--batching",
        parser=choice("length", "fixed"),
        metavar="length|fixed",
        help="'length': sort by tokens, token-budget batches; 'fixed': sentence-transformers' batching.",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        help="Run on Ray: 'auto' (the running cluster), 'ray://host:port' or 'local'.",
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        parser=integer(1),
        metavar="N",
        show_default="one per GPU, else per CPU",
        help="Run on Ray with N model replicas.",
    ),
]
AddCorpus = Annotated[
    bool, typer.Option("--add-corpus", help="Allow adding another corpus to a store built from a different one.")
]


def embed(
    out: OutStore,
    corpus: CorpusOrBenchmark = None,
    model: Model = None,
    calibration: CalibrationOption = None,
    basket_size: BasketSize = None,
    layers: CalibrationLayers = None,
    strength: Strength = None,
    text_field: TextField = "text",
    unit: Unit = None,
    langs: Langs = (),
    part: Part = None,
    prompt: Prompt = None,
    pooling: Pooling = None,
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
    shard_size: ShardSize = 1024,
    batching: Batching = "length",
    batch_size: BatchSize = 32,
    max_batch_tokens: MaxBatchTokens = 16384,
    ray_address: RayAddress = None,
    workers: Workers = None,
    add_corpus: AddCorpus = False,
) -> None:
    """Embed every distinct text of a corpus into the store --out, stock or calibrated. Resumable and idempotent."""
    # the job code, torch and the model are imported here, when the command runs, so that --help stays fast
    from posfair.calibration import STOCK
    from posfair.cli.terminal import say
    from posfair.cli.terminal_progress import progress_bars
    from posfair.distributed import EmbedSpec, embed_texts

    use_ray = ray_address is not None or workers is not None
    _check_options(use_ray, part, corpus, langs)
    checks.output_folder(out)
    cal = checks.calibration(calibration, basket_size, layers, strength)
    model_options = checks.ModelOptions(
        model, max_seq_length=max_seq_length, pooling=pooling, trust_remote_code=trust_remote_code, device=device
    ).checked()
    spec = EmbedSpec(
        model=model_options.source,
        calibration=cal.to_dict() if cal is not STOCK else None,
        prompt=prompt,
        pooling=model_options.pooling,
        max_seq_length=model_options.max_seq_length,
        trust_remote_code=model_options.trust_remote_code,
        device=model_options.device,
        batching=batching,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
    )
    texts, source = _read_texts(corpus, part, text_field, unit, langs)
    # the driver's model (on Ray it only gives the fingerprint and dimension: kept off the GPUs); checks the calibration's layers
    fm = checks.load_model(model_options, device="cpu" if use_ray else None)
    fm.eval()
    checks.check_calibrations(fm, [cal])
    say(_engine_line(use_ray, ray_address, workers))
    with progress_bars() as bar:
        report = embed_texts(
            texts,
            out,
            spec,
            model=fm,
            shard_size=shard_size,
            engine="ray" if use_ray else "local",
            ray_address=None if ray_address == "local" else ray_address,
            workers=workers,
            corpus_source=source,
            text_field=text_field,
            add_corpus=add_corpus,
            progress=bar("embedding", len(set(texts))),
        )
    say(_summary_line(report, fm.display_name, cal.label()))


def _check_options(use_ray: bool, part: str | None, corpus: str | None, langs) -> None:
    """The option combinations ``embed`` refuses, before any work."""
    from posfair.cli.error_boundary import PosfairInputError
    from posfair.distributed.ray_engine import RAY_INSTALL_HINT, ray_available

    if use_ray and not ray_available():
        raise PosfairInputError(f"--ray-address / --workers run on Ray, which is not installed: {RAY_INSTALL_HINT}")
    if part is not None and corpus is None:
        raise PosfairInputError(f"--part {part} needs --corpus naming a benchmark (a name or a folder)")
    if part is not None and len(langs) > 1:  # a benchmark's queries are of one language (its documents may differ)
        raise PosfairInputError(f"--lang {','.join(langs)}: with --part, one language (the benchmark's)")


def _read_texts(corpus: str | None, part: str | None, text_field: str, unit, langs) -> tuple[list[str], str]:
    """The texts to embed and a description of their source: a corpus's texts, or with ``--part`` any benchmark
    retrieval reads (PosIR layout, SQuAD-PosQ, FineWeb-PosQ), its documents or queries as the retrieval command
    sees them."""
    from posfair.cli.error_boundary import naming
    from posfair.distributed import read_corpus_texts
    from posfair.retrieval import load_benchmark

    with naming("--corpus", corpus or "bundled"):
        if part is None:
            return read_corpus_texts(corpus, text_field=text_field, unit=unit, langs=list(langs) or None)
        bench = load_benchmark(corpus, lang=langs[0] if langs else None)
        texts = bench.corpus_texts if part == "documents" else bench.query_texts
        return texts, f"benchmark {bench.name} ({part})"


def _engine_line(use_ray: bool, ray_address: str | None, workers: int | None) -> str:
    """Where the job runs, said before it starts."""
    from posfair.distributed.ray_engine import RAY_INSTALL_HINT, ray_available

    if use_ray:
        where = "a local Ray instance" if ray_address in (None, "local") else f"Ray at {ray_address}"
        count = "one worker per GPU/CPU" if not workers else f"{workers} worker{'s' if workers != 1 else ''}"
        return f"engine: {where}, {count}"
    extra = "" if ray_available() else f" (Ray is not installed; for many workers/machines: {RAY_INSTALL_HINT})"
    return f"engine: single process{extra}"


def _summary_line(report, model_name: str, setting: str) -> str:
    """The one line said when the job is done: texts, namespace, shards, speed, padding waste, calibrated share."""
    from posfair.cli.terminal_tables import plural

    return (
        f"{plural(report.texts, 'distinct text')} ({model_name}, {setting}) in namespace {report.namespace}: "
        f"{plural(report.written, 'shard')} written, {report.skipped} already present; "
        f"{plural(report.encoded, 'text')} encoded in {report.seconds:.1f}s "
        f"({report.texts_per_second:.1f} texts/s, {plural(report.workers, 'worker')}, padding waste {report.padding_waste:.1%})"
        + (f"; calibrated share {report.calibrated_share:.3f}" if report.calibrated_share is not None else "")
    )
