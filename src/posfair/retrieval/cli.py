"""CLI commands ``retrieval``, ``sweep`` and ``build-benchmark`` (mounted by ``posfair.cli``)."""

from __future__ import annotations

from pathlib import Path

import typer

from posfair.cliutil import MAX_SEQ_LENGTH_HELP

app = typer.Typer(help="Position-aware retrieval evaluation.", no_args_is_help=True)


def _split(s: str | None) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()] if s else []


def _layers(s: str):
    return float(s) if "." in s else int(s)


def _load(model: str | None, max_seq_length: int | None, trust_remote_code: bool, device: str | None):
    from posfair.cliutil import load_model_option

    return load_model_option(model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device)


def _benchmark(benchmark: str, lang: str | None, corpus_lang: str | None, domains: str | None):
    from posfair.retrieval.benchmarks import load_benchmark

    return load_benchmark(benchmark, lang=lang, corpus_lang=corpus_lang, domains=_split(domains) or None)


def _prompt(query_prompt: str) -> str | None:
    return None if query_prompt.lower() == "none" else query_prompt.encode().decode("unicode_escape") if query_prompt != "auto" else "auto"


def _show(results, out: Path) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    from posfair.calibration.coverage import NOOP_LABEL
    from posfair.retrieval.sweep import noop_settings
    from posfair.retrieval.tables import bucket_table, group_table, to_markdown

    console = Console()
    if any(r.groups for r in results):
        console.print(
            Markdown(f"**{results[0].benchmark}** - nDCG@10 per positional group (x100), Harm, PSI\n\n" + to_markdown(group_table(results)))
        )
    if any(r.buckets for r in results):
        console.print(
            Markdown(f"**{results[0].benchmark}** - PSI per length bucket and aggregate nDCG@10\n\n" + to_markdown(bucket_table(results)))
        )
    noop = noop_settings(results)
    if noop:
        n_cal = sum(r.method == "calibrated" for r in results)
        console.print(
            f"{len(noop)} of {n_cal} calibrations change no document of this benchmark ({NOOP_LABEL}; every document is shorter "
            f"than one basket or exactly one basket) and were not evaluated: {', '.join(noop)}",
            markup=False,
            highlight=False,
        )
    console.print(f"results in {out}")


_MODEL = typer.Option(None, "--model", "-m", help="Hub id or local folder (default: the bundled all-MiniLM-L6-v2).")
_BENCH = typer.Option(..., "--benchmark", "-b", help="squad-posq | squad-posq-tiny | fineweb-posq | posir | a hub id | a local path.")
_LANG = typer.Option(None, "--lang", help="PosIR-layout query language (eng-Latn or en).")
_CLANG = typer.Option(None, "--corpus-lang", help="Corpus language for cross-lingual retrieval (default: --lang).")
_DOMAINS = typer.Option(None, "--domains", help="Comma-separated PosIR domains (default: all).")
_PROMPT = typer.Option(
    "auto", "--query-prompt", help="Query prefix: 'auto' (published per-model prompt), 'none', or a string (\\n allowed)."
)
_OUT = typer.Option(None, "--out", "-o", help="Output directory (default: ./posfair-results/<benchmark>).")
_CACHE = typer.Option(None, "--cache", help="Embedding cache directory (default: OUT/embeddings).")
_MAX_SEQ = typer.Option(None, "--max-seq-length", help=MAX_SEQ_LENGTH_HELP)


def _run(
    model,
    bench,
    cals,
    out,
    cache,
    sea,
    stock,
    query_prompt,
    batch_size,
    top_k,
    faiss,
    max_seq_length,
    trust_remote_code,
    device,
    lang,
    corpus_lang,
    domains,
):
    from posfair.retrieval.sea import SegmentEmbedAverage
    from posfair.retrieval.sweep import run_sweep
    from posfair.store import EmbeddingStore, ManifestMismatch

    b = _benchmark(bench, lang, corpus_lang, domains)
    m = _load(model, max_seq_length, trust_remote_code, device)
    out = Path(out) if out else Path("posfair-results") / b.name.replace("/", "_")
    try:  # a store of other settings (posfair.store.open_namespace_dir) is refused with one line
        store = EmbeddingStore(cache) if cache else None
        results = run_sweep(
            m,
            b,
            cals,
            out,
            include_stock=stock,
            sea=SegmentEmbedAverage(batch_size=batch_size) if sea else None,
            store=store,
            query_prompt=_prompt(query_prompt),
            batch_size=batch_size,
            top_k=top_k,
            use_faiss=faiss,
            show_progress_bar=True,
        )
    except ManifestMismatch as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _show(results, out)


@app.command("retrieval")
def retrieval(
    model: str | None = _MODEL,
    benchmark: str = _BENCH,
    calibration: list[str] = typer.Option(
        [], "--calibration", "-c", help="BASKET,LAYERS,STRENGTH (repeatable), e.g. 128,0.5,0.5; 'default' = Calibration()."
    ),
    sea: bool = typer.Option(False, "--sea", help="Also run the Segment Embed Average baseline."),
    stock: bool = typer.Option(True, "--stock/--no-stock", help="Include the uncalibrated model."),
    lang: str | None = _LANG,
    corpus_lang: str | None = _CLANG,
    domains: str | None = _DOMAINS,
    query_prompt: str = _PROMPT,
    out: Path | None = _OUT,
    cache: Path | None = _CACHE,
    batch_size: int = typer.Option(32, "--batch-size"),
    top_k: int = typer.Option(100, "--top-k"),
    faiss: bool = typer.Option(False, "--faiss", help="Search with faiss.IndexFlatIP (exact; needs faiss-cpu)."),
    max_seq_length: int | None = _MAX_SEQ,
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    device: str | None = typer.Option(None, "--device"),
) -> None:
    """Evaluate a model on a position-aware benchmark: stock, calibrated documents, SEA."""
    from posfair.cliutil import calibrations_option

    cals = calibrations_option(calibration)
    _run(
        model,
        benchmark,
        cals,
        out,
        cache,
        sea,
        stock,
        query_prompt,
        batch_size,
        top_k,
        faiss,
        max_seq_length,
        trust_remote_code,
        device,
        lang,
        corpus_lang,
        domains,
    )


@app.command("sweep")
def sweep(
    model: str | None = _MODEL,
    benchmark: str = _BENCH,
    grid: bool = typer.Option(True, "--grid/--no-grid", help="The paper's grid basket x layers x strength."),
    fine: bool = typer.Option(False, "--fine", help="Fine strength sweep at one basket size."),
    baskets: str = typer.Option("128,256,512", "--baskets"),
    layers: str = typer.Option(
        "1,0.5", "--layers", help="Layer sets: int = last k layers, float = fraction (1 = last layer, 0.5 = last 50%)."
    ),
    strengths: str = typer.Option("0.5,1.0", "--strengths"),
    fine_basket: int = typer.Option(128, "--fine-basket"),
    step: float = typer.Option(0.05, "--step"),
    sea: bool = typer.Option(False, "--sea", help="Also run the Segment Embed Average baseline."),
    lang: str | None = _LANG,
    corpus_lang: str | None = _CLANG,
    domains: str | None = _DOMAINS,
    query_prompt: str = _PROMPT,
    out: Path | None = _OUT,
    cache: Path | None = _CACHE,
    batch_size: int = typer.Option(32, "--batch-size"),
    top_k: int = typer.Option(100, "--top-k"),
    faiss: bool = typer.Option(False, "--faiss"),
    max_seq_length: int | None = _MAX_SEQ,
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    device: str | None = typer.Option(None, "--device"),
) -> None:
    """Calibration sweep (grid and/or fine strength sweep); resumable: re-run the same command."""
    from posfair.retrieval.sweep import paper_grid, strength_sweep

    layer_sets = [_layers(x) for x in _split(layers)]
    cals = []
    if grid:
        cals += paper_grid([int(x) for x in _split(baskets)], layer_sets, [float(x) for x in _split(strengths)])
    if fine:
        cals += strength_sweep(fine_basket, layer_sets, step)
    if not cals:
        raise typer.BadParameter("choose --grid and/or --fine")
    _run(
        model,
        benchmark,
        cals,
        out,
        cache,
        sea,
        True,
        query_prompt,
        batch_size,
        top_k,
        faiss,
        max_seq_length,
        trust_remote_code,
        device,
        lang,
        corpus_lang,
        domains,
    )


@app.command("build-benchmark")
def build_benchmark(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory (PosIR layout)."),
    corpus: str | None = typer.Option(
        None, "--corpus", help="Corpus source for posfair.corpus.load_corpus (default: bundled Debian docs)."
    ),
    unit: str | None = typer.Option(None, "--unit", help="Corpus unit (bundled default: section)."),
    sources: str | None = typer.Option(None, "--sources", help="Comma-separated values of the corpus 'source' column to keep."),
    langs: str = typer.Option("en", "--langs", help="Comma-separated languages; documents are aligned across them."),
    k: int = typer.Option(3, "--k", help="Segments per document."),
    seed: int = typer.Option(0, "--seed"),
    name: str = typer.Option("aligned", "--name"),
    domain: str = typer.Option("all", "--domain"),
    max_doc_tokens: int | None = typer.Option(
        None,
        "--max-doc-tokens",
        help="Document token budget without special tokens (segments over budget // k are dropped); default: the model's token limit (--max-seq-length) minus its special tokens; 0 = no limit.",
    ),
    budget_langs: str | None = typer.Option(
        None, "--budget-langs", help="Languages whose documents must fit --max-doc-tokens (default: all of --langs)."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="The model the benchmark is built for: its tokenizer counts tokens and its token limit sets the budget (default: the bundled all-MiniLM-L6-v2).",
    ),
    max_seq_length: int | None = _MAX_SEQ,
) -> None:
    """Build a position-aware benchmark from an aligned corpus, saved in PosIR's layout."""
    import json

    from rich.console import Console

    from posfair.corpus import load_corpus
    from posfair.retrieval.benchmarks import build_from_corpus

    lang_list = _split(langs)
    df = load_corpus(corpus, unit=unit, langs=lang_list)
    if sources:
        keep = _split(sources)
        if "source" not in df.columns:
            raise typer.BadParameter("--sources given but the corpus has no 'source' column")
        unknown = set(keep) - set(df["source"].unique())
        if unknown:
            raise typer.BadParameter(f"unknown source(s) {sorted(unknown)}; available: {sorted(df['source'].unique())}")
        df = df[df["source"].isin(keep)]
    m = _load(model, max_seq_length, False, "cpu")
    count = lambda texts: m.token_lengths(texts, add_special_tokens=False).tolist()  # noqa: E731
    if max_doc_tokens is None:
        max_doc_tokens = m.max_seq_length - m.special_token_count()
    path = build_from_corpus(
        df,
        out,
        langs=lang_list,
        k=k,
        seed=seed,
        name=name,
        domain=domain,
        max_doc_tokens=max_doc_tokens or None,
        count_tokens=count,
        budget_langs=_split(budget_langs) or None,
        max_seq_length=m.max_seq_length,
    )
    Console().print_json(json.dumps(json.loads((path / "benchmark.json").read_text())))
