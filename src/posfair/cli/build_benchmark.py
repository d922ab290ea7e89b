"""``posfair build-benchmark``: a position-aware benchmark from an aligned corpus, in PosIR's layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli import checks
from posfair.cli.options import Corpus, Langs, MaxSeqLength, Model, OutFolder, Seed, Unit
from posfair.cli.parsers import comma_list, integer, joined, lang_code, name_part

Sources = Annotated[
    list[str],
    typer.Option(
        "--sources",
        parser=comma_list(str),
        callback=joined,
        metavar="SOURCE,...",
        show_default="all",
        help="Values of the corpus' 'source' column to keep, comma-separated.",
    ),
]
SegmentsPerDocument = Annotated[int, typer.Option("--k", parser=integer(1), metavar="K", help="Segments per document.")]
BenchmarkName = Annotated[str, typer.Option("--name", parser=name_part, metavar="NAME", help="Benchmark name.")]
Domain = Annotated[str, typer.Option("--domain", parser=name_part, metavar="DOMAIN", help="Domain folder name.")]
MaxDocTokens = Annotated[
    int | None,
    typer.Option(
        "--max-doc-tokens",
        parser=integer(0),
        metavar="TOKENS",
        show_default="the model's token limit minus its special tokens",
        help="Document token budget without special tokens (segments over budget // k are dropped); 0 = no limit.",
    ),
]
BudgetLangs = Annotated[
    list[str],
    typer.Option(
        "--budget-langs",
        parser=comma_list(lang_code),
        callback=joined,
        metavar="LANG,...",
        show_default="all of --lang",
        help="Languages whose documents must fit --max-doc-tokens, comma-separated.",
    ),
]


def build_benchmark(
    out: OutFolder = Path("posfair-build-benchmark"),
    corpus: Corpus = None,
    unit: Unit = None,
    sources: Sources = (),
    langs: Langs = ("en",),
    k: SegmentsPerDocument = 3,
    seed: Seed = 0,
    name: BenchmarkName = "aligned",
    domain: Domain = "all",
    max_doc_tokens: MaxDocTokens = None,
    budget_langs: BudgetLangs = (),
    model: Model = None,
    max_seq_length: MaxSeqLength = None,
) -> None:
    """Build a position-aware benchmark from an aligned corpus, saved in PosIR's layout (the model's tokenizer counts tokens)."""
    # pandas, the corpus loader and the model are imported here, when the command runs, so that --help stays fast
    from posfair.cli.error_boundary import data_errors
    from posfair.retrieval.benchmarks import build_from_corpus

    model_options = _check_options(budget_langs, langs, out, model, max_seq_length)
    df = _load_corpus(corpus, langs, unit, sources)
    m = checks.load_model(model_options, device="cpu")
    if max_doc_tokens is None:
        max_doc_tokens = m.max_seq_length - m.special_token_count()
    with data_errors(f"--corpus {corpus or 'bundled'}"):  # e.g. no segment present in every language
        path = build_from_corpus(
            df,
            out,
            langs=list(langs),
            k=k,
            seed=seed,
            name=name,
            domain=domain,
            max_doc_tokens=max_doc_tokens or None,
            count_tokens=lambda texts: m.token_lengths(texts, add_special_tokens=False).tolist(),
            budget_langs=list(budget_langs) or None,
            max_seq_length=m.max_seq_length,
        )
    _say_built(path, k, langs)


def _check_options(budget_langs, langs, out: Path, model, max_seq_length) -> checks.ModelOptions:
    """The options ``build-benchmark`` refuses and the folder it checks, before any work; the model's options."""
    from posfair.cli.error_boundary import input_error

    outside = [lang for lang in budget_langs if lang not in langs]
    if outside:
        raise input_error(
            "--budget-langs", ",".join(budget_langs), f"{', '.join(outside)} not among --lang {','.join(langs)}"
        )
    checks.output_folder(out, command="build-benchmark")
    return checks.ModelOptions(model, max_seq_length=max_seq_length).checked()


def _load_corpus(corpus, langs, unit, sources):
    """The corpus in ``langs``, kept to ``--sources`` when given (each checked against its 'source' column)."""
    from posfair.cli.error_boundary import PosfairInputError, input_error
    from posfair.cli.inputs import load_corpus

    df = load_corpus(corpus, list(langs), unit=unit)
    if sources:
        if "source" not in df.columns:
            raise PosfairInputError(f"--sources given, but the corpus {corpus or 'bundled'} has no 'source' column")
        unknown = sorted(set(sources) - set(df["source"].unique()))
        if unknown:
            raise input_error(
                "--sources",
                ",".join(sources),
                f"unknown source(s) {unknown}; available: {sorted(df['source'].unique())}",
            )
        df = df[df["source"].isin(sources)]
    return df


def _say_built(path: Path, k: int, langs) -> None:
    """The benchmark written at ``path`` in a sentence, then each language's size (a warning when it is small)."""
    import json
    import warnings

    from posfair.cli.terminal import say
    from posfair.retrieval.benchmarks import BenchmarkSizeWarning, load_benchmark

    info = json.loads((path / "benchmark.json").read_text())
    limit = info.get("max_doc_tokens")
    dropped = (
        f"{info.get('segments_dropped_too_long', 0)} of {info.get('segments_aligned', '?')} aligned segments dropped "
        + (f"as longer than {limit} // {k} = {limit // k} tokens" if limit else "(no document length limit)")
    )
    say(
        f"benchmark {info.get('name')} written to {path} (settings in {path / 'benchmark.json'}): "
        f"{info.get('documents')} documents of {k} segments each, languages {', '.join(info.get('langs', []))}, "
        f"documents within {limit or 'any number of'} tokens (model token limit {info.get('max_seq_length')}); "
        f"{dropped}"
    )
    advice = (
        "build it larger: --max-seq-length up to the model's position limit (longer documents fit), a smaller --k, "
        "--budget-langs with only the languages whose documents must fit, or a larger --corpus"
    )
    for lang in langs:  # each language is its own domain, searched on its own
        size = load_benchmark(str(path), lang=lang).size()
        say(size.line())
        message = size.warning(advice)
        if message:
            warnings.warn(message, BenchmarkSizeWarning, stacklevel=1)
