"""``posfair attention``: the pooling token's attention profile, stock vs calibrated."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from posfair.cliutil import MAX_SEQ_LENGTH_HELP

__all__ = ["app", "parse_layers", "build_documents", "run_attention"]

app = typer.Typer(help="Attention diagnosis: where the pooling token looks.", no_args_is_help=True)


def parse_layers(spec: str | None):
    """``None`` (last half), ``"6"`` (last 6), ``"0.5"`` (fraction) or ``"6+7+8"`` (0-based indices)."""
    if spec is None or not spec.strip():
        return None
    s = spec.strip()
    try:
        if "+" in s or "," in s:
            return tuple(int(x) for x in s.replace(",", "+").split("+"))
        return float(s) if "." in s else int(s)
    except ValueError:
        raise typer.BadParameter(
            f"--layers must be an int (last k layers), a fraction like 0.5 or indices like 6+7+8; got {spec!r}"
        ) from None


def build_documents(model, corpus, lang: str, n: int, max_docs: int, seed: int = 0):
    """Monolingual segment-set documents (the audit's builder): all orderings of random sets."""
    from posfair.fairness.documents import LanguageConfig, build_instance, prepare_corpus

    inst = build_instance(
        prepare_corpus(corpus), n, LanguageConfig.mono(lang),
        tokenizer=model.tokenizer, limit=int(model.max_seq_length), target_docs=max_docs, seed=seed,
    )  # fmt: skip
    return inst.documents[:max_docs]


def run_attention(
    model,
    corpus,
    *,
    langs,
    n,
    layers,
    basket_size,
    n_bins,
    calibration,
    max_docs,
    out: Path,
    batch_size=8,
    seed=0,
    model_name="",
    progress=None,
):
    """Profiles per language (stock and, if given, calibrated); writes arrays, figures and an HTML page."""
    from posfair.fairness.attention import attention_profile
    from posfair.report.attention_plots import attention_section
    from posfair.report.html import write_report

    out.mkdir(parents=True, exist_ok=True)
    profiles = []
    for lang in langs:
        docs = build_documents(model, corpus, lang, n, max_docs, seed)
        for cal in [None] + ([calibration] if calibration is not None else []):
            tick = progress(f"{lang} · {'stock' if cal is None else cal.label()}", len(docs)) if progress else None
            prof = attention_profile(
                model, docs, layers=layers, basket_size=basket_size, n_bins=n_bins, calibration=cal,
                batch_size=batch_size, group=lang, model_name=model_name, progress=tick,
            )  # fmt: skip
            prof.save(out / f"attention_{lang}_{'stock' if cal is None else cal.key()}")
            profiles.append(prof)
    section = attention_section(profiles, out)
    report = write_report(out / "attention.html", f"Attention profile — {model_name or 'model'}", [section])
    return profiles, report


@app.command("attention")
def attention_cmd(
    model: str | None = typer.Option(None, "--model", "-m", help="Model name or path (default: bundled all-MiniLM-L6-v2)."),
    corpus: str | None = typer.Option(None, "--corpus", "-c", help="Aligned corpus (default: the bundled corpus)."),
    n: int = typer.Option(3, "--n", help="Segments per document."),
    langs: list[str] = typer.Option(["en"], "--langs", help="Languages (one profile each; repeat the option)."),
    layers: str | None = typer.Option(
        None, "--layers", help="Layer set: last k (6), a fraction (0.5) or indices (6+7+8). Default: last half."
    ),
    basket_size: int = typer.Option(128, "--basket-size", help="Content keys per basket."),
    bins: int = typer.Option(20, "--bins", help="Relative-position bins."),
    calibration: str | None = typer.Option(
        None, "--calibration", help="Also profile the calibrated model: BASKET,LAYERS,STRENGTH or 'default'."
    ),
    max_docs: int = typer.Option(200, "--max-docs", help="Documents per language."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    batch_size: int = typer.Option(8, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    max_seq_length: int | None = typer.Option(None, "--max-seq-length", help=MAX_SEQ_LENGTH_HELP),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    device: str | None = typer.Option(None, "--device"),
):
    """Profile the pooling token's attention over segment-set documents (stock vs calibrated)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import posfair
    from posfair.calibration.coverage import format_share
    from posfair.cliutil import calibrations_option, load_model_option
    from posfair.corpus import load_corpus
    from posfair.fairness.attention import resolve_layers

    console = Console()
    if basket_size < 1:
        raise typer.BadParameter(f"--basket-size must be >= 1; got {basket_size}")
    if max_docs < 1:
        raise typer.BadParameter(f"--max-docs must be >= 1; got {max_docs}")
    try:
        cal = None
        if calibration:
            cal = calibrations_option([calibration])[0]
        fm = load_model_option(model, device=device, trust_remote_code=trust_remote_code, max_seq_length=max_seq_length)
        layer_spec = parse_layers(layers)
        resolve_layers(layer_spec, fm.num_layers)
        if cal is not None:
            fm.transformer_module.resolve(cal)
        data = load_corpus(corpus, langs=sorted(set(langs)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    name = model or posfair.model.BUNDLED_MODEL_NAME
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as prog:

        def progress(desc: str, total: int):
            task = prog.add_task(desc, total=total)
            return lambda k: prog.advance(task, k)

        profiles, report = run_attention(
            fm, data, langs=langs, n=n, layers=layer_spec, basket_size=basket_size, n_bins=bins, calibration=cal,
            max_docs=max_docs, out=out, batch_size=batch_size, seed=seed, model_name=name, progress=progress,
        )  # fmt: skip
    from rich.table import Table

    table = Table(
        title=f"Attention profile ({profiles[0].query_label}, layers {list(profiles[0].layers)}; {time.perf_counter() - t0:.0f} s)"
    )
    keys = list(profiles[0].summary())
    for col in ["lang", "profile", *keys]:
        table.add_column(col, justify="left" if col in ("lang", "profile") else "right")
    for p in profiles:
        s = p.summary()
        table.add_row(
            p.group, p.label, *[format_share(s.get(k)) if k == "calibrated_share" else f"{s.get(k, float('nan')):.4g}" for k in keys]
        )
    console.print(table)
    console.print(f"report: [bold]{report}[/bold]")
