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
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            parser=choice("documents", "queries"),
            metavar="documents|queries",
            help="Treat --corpus as a retrieval benchmark (a name such as posir or squad-posq, a hub id or a folder) and embed its documents or queries.",
        ),
    ] = None,
    prompt: Prompt = None,
    pooling: Pooling = None,
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
    shard_size: Annotated[
        int,
        typer.Option(
            "--shard-size",
            parser=integer(1),
            metavar="N",
            help="Distinct texts per shard (a killed run loses at most the shards in flight).",
        ),
    ] = 1024,
    batching: Annotated[
        str,
        typer.Option(
            "--batching",
            parser=choice("length", "fixed"),
            metavar="length|fixed",
            help="'length': sort by tokens, token-budget batches; 'fixed': sentence-transformers' batching.",
        ),
    ] = "length",
    batch_size: BatchSize = 32,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            parser=integer(1),
            metavar="TOKENS",
            help="Padded-token budget of a batch (length batching).",
        ),
    ] = 16384,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDRESS",
            help="Run on Ray: 'auto' (the running cluster), 'ray://host:port' or 'local'.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            parser=integer(1),
            metavar="N",
            show_default="one per GPU, else per CPU",
            help="Run on Ray with N model replicas.",
        ),
    ] = None,
    add_corpus: Annotated[
        bool, typer.Option("--add-corpus", help="Allow adding another corpus to a store built from a different one.")
    ] = False,
) -> None:
    """Embed every distinct text of a corpus into the store --out, stock or calibrated. Resumable and idempotent."""
    # the job code, torch and the model are imported here, when the command runs, so that --help stays fast
    from posfair.calibration import STOCK
    from posfair.cli.errors import PosfairInputError, naming
    from posfair.cli.progress import progress_bars
    from posfair.distributed import EmbedSpec, embed_texts, read_corpus_texts
    from posfair.distributed.ray_engine import RAY_INSTALL_HINT, ray_available
    from posfair.retrieval import load_benchmark

    use_ray = ray_address is not None or workers is not None
    if use_ray and not ray_available():
        raise PosfairInputError(f"--ray-address / --workers run on Ray, which is not installed: {RAY_INSTALL_HINT}")
    if part is not None and corpus is None:
        raise PosfairInputError(f"--part {part} needs --corpus naming a benchmark (a name or a folder)")
    if part is not None and len(langs) > 1:  # a benchmark's queries are of one language (its documents may differ)
        raise PosfairInputError(f"--lang {','.join(langs)}: with --part, one language (the benchmark's)")
    lang = langs[0] if part is not None and langs else None
    checks.output_folder(out)
    cal = checks.calibration(calibration, basket_size, layers, strength)
    model_id = checks.model_source(model, trust_remote_code=trust_remote_code)
    checks.device(device)
    spec = EmbedSpec(
        model=model_id,
        calibration=cal.to_dict() if cal is not STOCK else None,
        prompt=prompt,
        pooling=pooling,
        max_seq_length=max_seq_length,
        trust_remote_code=trust_remote_code,
        device=device,
        batching=batching,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )
    with naming("--corpus", corpus or "bundled"):
        if (
            part is not None
        ):  # any benchmark retrieval reads (PosIR layout, SQuAD-PosQ, FineWeb-PosQ), as the retrieval command sees it
            bench = load_benchmark(corpus, lang=lang)
            texts = bench.corpus_texts if part == "documents" else bench.query_texts
            source = f"benchmark {bench.name} ({part})"
        else:
            texts, source = read_corpus_texts(corpus, text_field=text_field, unit=unit, langs=list(langs) or None)
    # the driver's model (on Ray it only gives the fingerprint and dimension: kept off the GPUs); checks the calibration's layers
    fm = checks.load_model(
        model_id,
        device="cpu" if use_ray else device,
        trust_remote_code=trust_remote_code,
        pooling=pooling,
        max_seq_length=max_seq_length,
    )
    fm.eval()
    checks.check_calibrations(fm, [cal])
    if use_ray:
        where = "a local Ray instance" if ray_address in (None, "local") else f"Ray at {ray_address}"
        count = "one worker per GPU/CPU" if not workers else f"{workers} worker{'s' if workers != 1 else ''}"
        typer.echo(f"engine: {where}, {count}")
    else:
        extra = "" if ray_available() else f" (Ray is not installed; for many workers/machines: {RAY_INSTALL_HINT})"
        typer.echo(f"engine: single process{extra}")
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
    from posfair.cli.tables import plural

    label = cal.label()
    typer.echo(
        f"{plural(report.texts, 'distinct text')} ({fm.display_name}, {label}) in namespace {report.namespace}: "
        f"{plural(report.written, 'shard')} written, {report.skipped} already present; "
        f"{plural(report.encoded, 'text')} encoded in {report.seconds:.1f}s "
        f"({report.texts_per_second:.1f} texts/s, {plural(report.workers, 'worker')}, padding waste {report.padding_waste:.1%})"
        + (f"; calibrated share {report.calibrated_share:.3f}" if report.calibrated_share is not None else "")
    )
