"""``posfair tune``: choose a calibration setting (mounted by ``posfair.cli``)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from posfair.cliutil import MAX_SEQ_LENGTH_HELP

__all__ = ["app"]

app = typer.Typer(help="Choose a calibration setting.", no_args_is_help=True)


def _split(s: str | None) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()] if s else []


def _space(grid: str, baskets: str | None, layers: str | None, strengths: str | None, fine_rounds: int):
    from posfair.calibration.params import parse_layers
    from posfair.tuning.tuner import SearchSpace

    if grid not in ("default", "paper"):
        raise ValueError(f"--grid is 'default' or 'paper'; got {grid!r}")
    base = SearchSpace.paper(fine_rounds) if grid == "paper" else SearchSpace(fine_rounds=fine_rounds)
    return SearchSpace(
        basket_sizes=tuple(int(b) for b in _split(baskets)) or base.basket_sizes,
        layer_sets=tuple(parse_layers(x) for x in _split(layers)) or base.layer_sets,
        strengths=tuple(float(a) for a in _split(strengths)) or base.strengths,
        fine_rounds=fine_rounds,
    )


@app.command("tune")
def tune_cmd(
    model: str | None = typer.Option(None, "--model", "-m", help="Hub id or local folder (default: the bundled all-MiniLM-L6-v2)."),
    corpus: str | None = typer.Option(None, "--corpus", "-c", help="Aligned corpus (default: the bundled corpus)."),
    objective: str = typer.Option(
        "fairness", "--objective", help="fairness (flatten σ, keep own-segment recall) or retrieval (raise Harm of nDCG@10, keep nDCG@10)."
    ),
    benchmark: str | None = typer.Option(
        None, "--benchmark", "-b", help="Retrieval: a benchmark (name, hub id or path) instead of one built from --corpus."
    ),
    max_recall_drop: float = typer.Option(
        2.0, "--max-recall-drop", help="Fairness: most own-segment recall@n may fall below stock (points)."
    ),
    max_ndcg_drop: float = typer.Option(2.0, "--max-ndcg-drop", help="Retrieval: most aggregate nDCG@10 may fall below stock (points)."),
    score: str = typer.Option(
        "spread", "--score", help="Fairness score to minimise: spread (σ profile max - min) or max-beta (max |β_p|)."
    ),
    grid: str = typer.Option(
        "default",
        "--grid",
        help="default (baskets 16,64,256 x layers 0.5,1.0 x strengths 0.5,1.0) or paper (128,256,512 x 1,0.5 x 0.5,1.0).",
    ),
    baskets: str | None = typer.Option(None, "--baskets", help="Override the grid's basket sizes, e.g. 16,64."),
    layers: str | None = typer.Option(None, "--layers", help="Override the grid's layer sets: 3 (last 3), 0.5 (last half), 1.0 (all)."),
    strengths: str | None = typer.Option(None, "--strengths", help="Override the grid's strengths, e.g. 0.5,1.0."),
    fine_rounds: int = typer.Option(2, "--fine-rounds", help="Rounds of strength bisection around the best grid setting."),
    n: int = typer.Option(3, "--n", help="Fairness: segments per document."),
    lang: str = typer.Option("en", "--lang", help="Language (fairness documents; retrieval benchmark built from the corpus)."),
    docs: int = typer.Option(120, "--docs", help="Fairness: documents in dev + test together."),
    test_fraction: float = typer.Option(
        0.5, "--test-fraction", help="Share of segment sets (fairness) or documents' queries (retrieval) held out."
    ),
    seed: int = typer.Option(0, "--seed"),
    batch_size: int = typer.Option(16, "--batch-size"),
    out: Path = typer.Option(Path("posfair-tune"), "--out", "-o", help="Output directory (resumable: re-run the same command)."),
    cache: Path | None = typer.Option(None, "--cache", help="Embedding cache (default: OUT/cache)."),
    save_model: Path | None = typer.Option(
        None, "--save-model", help="Save the model with the chosen calibration persisted into this folder."
    ),
    max_seq_length: int | None = typer.Option(None, "--max-seq-length", help=MAX_SEQ_LENGTH_HELP),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    device: str | None = typer.Option(None, "--device"),
) -> None:
    """Search basket size x layers x strength on a dev split under a constraint; report the Pareto front and the test split."""
    from rich.console import Console

    from posfair import cliutil
    from posfair.tuning.evaluator import tune
    from posfair.tuning.report import summary_markdown

    console = Console()
    try:
        if objective not in ("fairness", "retrieval"):
            raise ValueError(f"--objective is 'fairness' or 'retrieval'; got {objective!r}")
        space = _space(grid, baskets, layers, strengths, fine_rounds)
        fm = cliutil.load_model_option(model, device=device, trust_remote_code=trust_remote_code, max_seq_length=max_seq_length)
        df = bench = settings = None
        if objective == "retrieval" and benchmark is not None:
            from posfair.retrieval.benchmarks import load_benchmark

            bench = load_benchmark(benchmark)
        else:
            from posfair.corpus import load_corpus

            df = load_corpus(corpus, langs=[lang])
        if objective == "fairness":
            from posfair.tuning.tuner import default_fairness_settings

            settings = default_fairness_settings(n_values=(n,), configs=(lang,), target_docs=docs, seed=seed, batch_size=batch_size)
        t0 = time.perf_counter()
        result = tune(
            fm, df, objective=objective, benchmark=bench, settings=settings, space=space,
            max_drop=(max_recall_drop if objective == "fairness" else max_ndcg_drop) / 100,
            score={"spread": "spread", "max-beta": "max_abs_beta"}.get(score, score) if objective == "fairness" else None,
            test_fraction=test_fraction, seed=seed, out_dir=out, cache_dir=cache, save_model=save_model, lang=lang,
            log=lambda msg: console.print(msg, highlight=False, markup=False, soft_wrap=True),
        )  # fmt: skip
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    console.print(summary_markdown(result), markup=False, highlight=False, soft_wrap=True)
    console.print(
        f"{time.perf_counter() - t0:.0f} s; results in [bold]{out}[/bold]"
        + (f"; tuned model in [bold]{save_model}[/bold]" if save_model else "")
    )
