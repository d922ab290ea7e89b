"""``posfair fit``: fit a repair on some document families, judge it on another, save it only when it holds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from posfair.cli import checks
from posfair.cli.options import Corpus, Model, Seed
from posfair.cli.parsers import choice, comma_list, integer, joined, number

#: the exit code of a fit that finished (its report written) but did not save the model: the repair fails its
#: held-out checks (``posfair tune`` uses the same code for the same case)
EXIT_NOT_SAVED = 3

Out = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        metavar="DIR",
        help="Output folder (created if missing): the repaired model (posfair.load_model(DIR)), its report in "
        "DIR/fit/.",
    ),
]
FitMethod = Annotated[
    str,
    typer.Option(
        "--method",
        parser=choice("finetune", "learned", "tempscale", "grid"),
        metavar="finetune|learned|tempscale|grid",
        help="finetune: fine-tuning toward the stock model's order-free embedding of each segment set; learned: per-head calibration strengths by gradient; "
        "tempscale: a softmax temperature; grid: the papers' grid as tune searches it.",
    ),
]
TestFamily = Annotated[
    str | None,
    typer.Option(
        "--test-family",
        metavar="FAMILY",
        show_default="the family with the fewest sections",
        help="The corpus's document family held out to judge the repair (the rest is fitted on).",
    ),
]
MaxRecallDrop = Annotated[
    float,
    typer.Option(
        "--max-recall-drop",
        parser=number(0, 100),
        metavar="POINTS",
        help="Most own-segment recall@1, and the share of own segments nearer than every foreign one, may fall "
        "on the held-out family (points).",
    ),
]
MinRemoved = Annotated[
    float,
    typer.Option(
        "--min-removed",
        parser=number(0, 100),
        metavar="PERCENT",
        help="The share of stock's |β_p| the repair must remove at every later position on the held-out family.",
    ),
]
MaxSeqLength = Annotated[
    int,
    typer.Option(
        "--max-seq-length",
        parser=integer(16, 1_000_000),
        metavar="TOKENS",
        help="The documents' token limit while fitting and judging (the saved folder keeps the model's own).",
    ),
]
Steps = Annotated[
    int | None,
    typer.Option(
        "--steps",
        parser=integer(1, 1_000_000),
        metavar="N",
        show_default="the method's own (finetune 200, learned 200)",
        help="Optimiser steps of finetune and learned (a short run to try the command; the checks still apply).",
    ),
]
Adapter = Annotated[
    str | None,
    typer.Option(
        "--adapter",
        parser=choice("lora"),
        metavar="lora",
        show_default="none: every weight fine-tuned",
        help="finetune trains a LoRA adapter alone and saves an adapter folder of a few MB (its config names the "
        "base model; posfair.load_model(DIR) loads base and adapter).",
    ),
]
LoraRank = Annotated[
    int | None,
    typer.Option(
        "--lora-rank", parser=integer(1, 4096), metavar="R", show_default="16", help="The LoRA adapter's rank r."
    ),
]
LoraAlpha = Annotated[
    float | None,
    typer.Option(
        "--lora-alpha",
        parser=number(0, 1e6, low_open=True),
        metavar="NUMBER",
        show_default="2 x the rank",
        help="The LoRA adapter's alpha (its update is scaled by alpha / r).",
    ),
]
LoraTargets = Annotated[
    list[str] | None,
    typer.Option(
        "--lora-targets",
        parser=comma_list(str),
        callback=joined,
        metavar="NAME,...",
        show_default="the model's attention projections",
        help="The linear modules the adapter adapts, by name or the end of it (query,value; "
        "attention.output.dense); each must name a module of the model.",
    ),
]
SaveAnyway = Annotated[
    bool,
    typer.Option("--save-anyway", help="Save the repaired model even when it fails its held-out checks."),
]


def fit(
    model: Model = None,
    corpus: Corpus = None,
    method: FitMethod = "finetune",
    test_family: TestFamily = None,
    max_recall_drop: MaxRecallDrop = 1.0,
    min_removed: MinRemoved = 90.0,
    max_seq_length: MaxSeqLength = 512,
    steps: Steps = None,
    save_anyway: SaveAnyway = False,
    seed: Seed = 0,
    adapter: Adapter = None,
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_targets: LoraTargets = None,
    out: Out = Path("posfair-fit"),
) -> None:
    """Fit a repair of positional bias on a corpus, judge it on a held-out family, save it when it holds."""
    from posfair.cli.error_boundary import data_errors
    from posfair.cli.inputs import load_corpus
    from posfair.cli.terminal import error, say
    from posfair.cli.terminal_progress import progress_bars

    checks.output_folder(out)
    lora = _lora(method, adapter, lora_rank, lora_alpha, lora_targets)
    model_id = checks.model_source(model)
    from posfair.repair.data import held_out_family
    from posfair.repair.fitting import fit_repair
    from posfair.repair.heldout import RepairLimits

    df = load_corpus(corpus)  # every language: the English sections are fitted on, the others judge the languages
    if "en" not in set(df["lang"].astype(str)):
        from posfair.cli.error_boundary import input_error

        langs = ", ".join(sorted(set(df["lang"].astype(str))))
        raise input_error("--corpus", corpus, f"a repair is fitted on English ('en') sections; it has {langs}")
    held_out_family(df, test_family)  # refused now, before the model loads
    limits = RepairLimits(min_removed=min_removed / 100, max_recall_drop=max_recall_drop)
    with progress_bars() as bar, data_errors():
        ticks: dict[str, tuple] = {}

        def progress(what: str, step: int, total: int, value: float) -> None:
            if what not in ticks:
                ticks[what] = (bar(what, total), [0])
            tick, done = ticks[what]
            tick(max(0, step - done[0]), note=None if math.isnan(value) else f"loss {value:.4g}")
            done[0] = max(done[0], step)

        result = fit_repair(
            model_id, out, corpus=df, method=method, test_family=test_family, limits=limits,
            max_seq_length=max_seq_length, save_failing=save_anyway, progress=progress, steps=steps, seed=seed,
            lora=lora,
        )  # fmt: skip
    for line in summary_lines(result):
        say(line)
    if not result.saved:
        error(f"repaired model not saved to {out}: {'; '.join(result.failures)} (--save-anyway saves it)")
        raise typer.Exit(EXIT_NOT_SAVED)


def _lora(method: str, adapter: str | None, rank: int | None, alpha: float | None, targets: list[str] | None):
    """The LoRA settings the options ask for (None: no adapter); an adapter option without ``--adapter lora``, or
    an adapter of another method than finetune, refused."""
    from posfair.cli.error_boundary import PosfairInputError
    from posfair.repair.finetune import LoraSettings

    given = [name for name, v in (("--lora-rank", rank), ("--lora-alpha", alpha), ("--lora-targets", targets)) if v]
    if adapter is None:
        if given:
            raise PosfairInputError(f"{given[0]}: only with --adapter lora")
        return None
    if method != "finetune":
        raise PosfairInputError(f"--adapter lora: only with --method finetune; got --method {method}")
    return LoraSettings(rank=rank or LoraSettings.rank, alpha=alpha, targets=tuple(targets or ()))


def summary_lines(result) -> list[str]:
    """The plain summary: what was fitted where, bias removed and retrieval change with intervals, the verdict."""
    from posfair.repair.heldout import heldout_lines

    h = result.heldout
    counts = result.counts
    fitted_on = ", ".join(result.fit_families) or "the other families"
    lines = [
        f"{result.method} fitted on {fitted_on} (train {counts['train'][0]} sets, dev {counts['dev'][0]}); "
        f"held-out family {h.family}: {h.sets} sets, {h.documents} documents",
    ]
    lines += heldout_lines(h)  # documents, then the title queries (nDCG@10, recall@1) and other languages
    lines += [f"note: {n}" for n in result.notes]
    lines.append(f"fit {result.fit_seconds:.0f} s; encoding costs {result.encode_ratio:.2f}x stock")
    verdict = "holds" if result.holds else "fails: " + "; ".join(result.failures)
    where = f"saved to {result.out_dir}" if result.saved else "not saved"
    lines.append(f"held-out checks: {verdict}; {where}; report in {Path(result.out_dir) / 'fit'}")
    return lines
