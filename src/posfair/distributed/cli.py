"""``posfair embed``: embed a whole corpus into an embedding store, in this process or on Ray."""

from __future__ import annotations

from pathlib import Path

import typer

from posfair.cliutil import MAX_SEQ_LENGTH_HELP

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)


@app.command()
def embed(
    out: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="embedding store folder (the cache folder the audit / retrieval / sweep read); on a cluster, a shared file system path",
    ),
    corpus: str | None = typer.Option(
        None, "--corpus", "-c", help="posfair corpus, plain .parquet/.jsonl, HF dataset, or a benchmark with --part; default: bundled"
    ),
    model: str | None = typer.Option(None, "--model", "-m", help="hub id or folder; default: the bundled all-MiniLM-L6-v2"),
    calibration: str | None = typer.Option(None, "--calibration", help="B,layers,alpha, e.g. 128,0.5,0.5 (default: stock)"),
    basket_size: int | None = typer.Option(None, "--basket-size", help="calibrate with this basket size"),
    layers: str | None = typer.Option(None, "--layers", help="calibrated layers: k (last k), 0.5 (last half), or 3+4+5"),
    strength: float | None = typer.Option(None, "--strength", help="calibration strength in [0, 1]"),
    text_field: str = typer.Option("text", "--text-field", help="field/column holding the texts"),
    unit: str | None = typer.Option(None, help="posfair corpus: keep rows of this unit (bundled default: section)"),
    langs: str | None = typer.Option(None, help="posfair corpus: comma-separated languages to keep"),
    part: str | None = typer.Option(
        None, "--part", help="treat --corpus as a retrieval benchmark (e.g. a PosIR folder) and embed its 'documents' or 'queries'"
    ),
    lang: str | None = typer.Option(None, "--lang", help="benchmark language (PosIR)"),
    prompt: str | None = typer.Option(None, help="text prefix (e.g. a query instruction)"),
    pooling: str | None = typer.Option(None, help="override the pooling: cls, mean or lasttoken"),
    max_seq_length: int | None = typer.Option(None, "--max-seq-length", help=MAX_SEQ_LENGTH_HELP),
    trust_remote_code: bool = typer.Option(False, help="allow code shipped with the model"),
    device: str | None = typer.Option(None, help="local engine / CPU workers; Ray GPU workers use cuda"),
    shard_size: int = typer.Option(
        1024, "--shard-size", min=1, help="distinct texts per shard (a killed run loses at most the shards in flight)"
    ),
    batching: str = typer.Option("length", help="'length': sort by tokens, token-budget batches; 'fixed': sentence-transformers' batching"),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="most texts per batch"),
    max_tokens: int = typer.Option(16384, "--max-tokens", min=1, help="padded-token budget of a batch (length batching)"),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="run on Ray: 'auto' (the running cluster), 'ray://host:port' or 'local'"
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="run on Ray with N model replicas (default: one per GPU, else per CPU)"
    ),
    add_corpus: bool = typer.Option(False, "--add-corpus", help="allow adding another corpus to a store built from a different one"),
) -> None:
    """Embed every distinct text of a corpus into STORE, stock or calibrated. Resumable and idempotent."""
    from posfair import cliutil
    from posfair.distributed.job import RAY_INSTALL_HINT, EmbedSpec, ManifestMismatch, embed_texts, ray_available, read_corpus_texts

    use_ray = ray_address is not None or workers is not None
    if use_ray and not ray_available():
        raise typer.BadParameter(f"--ray-address / --workers run on Ray, which is not installed: {RAY_INSTALL_HINT}")
    cal = cliutil.calibration_option(calibration, basket_size, layers, strength)
    spec = EmbedSpec(
        model=model, calibration=cal.to_dict() if cal else None, prompt=prompt, pooling=pooling, max_seq_length=max_seq_length,
        trust_remote_code=trust_remote_code, device=device, batching=batching, batch_size=batch_size, max_tokens=max_tokens,
    )  # fmt: skip
    lang_list = [x.strip() for x in langs.split(",") if x.strip()] if langs else None
    try:
        texts, source = read_corpus_texts(corpus, text_field=text_field, unit=unit, langs=lang_list, benchmark_part=part, lang=lang)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if use_ray:
        where = "a local Ray instance" if ray_address in (None, "local") else f"Ray at {ray_address}"
        typer.echo(f"engine: {where}, {workers or 'one per GPU/CPU'} workers")
    else:
        extra = "" if ray_available() else f" (Ray is not installed; for many workers/machines: {RAY_INSTALL_HINT})"
        typer.echo(f"engine: single process{extra}")
    n_unique = len(set(texts))
    if out.exists() and not out.is_dir():
        typer.echo(f"error: --out {out} is a file, not a store folder", err=True)
        raise typer.Exit(2)
    # a damaged shard is set aside and recomputed: one "warning: ..." line names it and where it went
    with cliutil.one_line_warnings(), cliutil.progress() as prog:
        task = prog.add_task("embedding", total=n_unique)
        try:
            report = embed_texts(
                texts, out, spec, shard_size=shard_size, engine="ray" if use_ray else "local",
                ray_address=None if ray_address == "local" else ray_address, workers=workers, corpus_source=source,
                text_field=text_field, add_corpus=add_corpus, progress=lambda k: prog.advance(task, k),
            )  # fmt: skip
        except ManifestMismatch as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    label = cal.label() if cal else "stock"
    typer.echo(
        f"{report.texts} distinct texts ({label}) in {report.namespace}: {report.written} shards written, "
        f"{report.skipped} already present; {report.encoded} texts encoded in {report.seconds:.1f}s "
        f"({report.texts_per_second:.1f} texts/s, {report.workers} worker(s), padding waste {report.padding_waste:.1%})"
        + (f"; calibrated share {report.calibrated_share:.3f}" if report.calibrated_share is not None else "")
    )
