"""``posfair tune``: choose a calibration on a dev split under a constraint; report it on a test split."""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Annotated

import typer

from posfair.calibration.params import SCHEDULES, TRAILING, VARIANTS
from posfair.cli import checks
from posfair.cli.options import (
    DOCS_DEFAULT,
    Baskets,
    BatchSize,
    Cache,
    Corpus,
    Device,
    Lang,
    LayerSets,
    MaxSeqLength,
    Model,
    Ns,
    OptionalBenchmark,
    OutTune,
    Seed,
    SpaceChoice,
    Strengths,
    TrustRemoteCode,
    list_option,
)
from posfair.cli.parsers import choice, integer, number, special_share

#: the exit code of a run that finished (its results written) but did not save the model --save-model asked for,
#: because the chosen setting fails on the held-out test split
EXIT_NOT_SAVED = 3


def fit_space(space, token_limit: int | None):
    """``space`` without the basket sizes >= ``token_limit`` (a document of at most that many tokens, special
    tokens included, has fewer content tokens than one such basket: the calibration would change nothing), and
    those sizes; every size is kept when none would remain."""
    import dataclasses

    if not token_limit:
        return space, []
    kept = tuple(b for b in space.basket_sizes if b < token_limit)
    dropped = [b for b in space.basket_sizes if b >= token_limit]
    if not kept or not dropped:
        return space, []
    return dataclasses.replace(space, basket_sizes=kept), dropped


Objective = Annotated[
    str,
    typer.Option(
        "--objective",
        parser=choice("fairness", "retrieval"),
        metavar="fairness|retrieval",
        help="fairness (flatten σ, keep own-segment recall) or retrieval (raise Harm of nDCG@10, keep nDCG@10).",
    ),
]
MaxRecallDrop = Annotated[
    float,
    typer.Option(
        "--max-recall-drop",
        parser=number(0, 100),
        metavar="POINTS",
        help="Fairness: most own-segment recall@n may fall below stock (points, 0..100).",
    ),
]
MaxNdcgDrop = Annotated[
    float,
    typer.Option(
        "--max-ndcg-drop",
        parser=number(0, 100),
        metavar="POINTS",
        help="Retrieval: most aggregate nDCG@10 may fall below stock (points, 0..100).",
    ),
]
Score = Annotated[
    str,
    typer.Option(
        "--score",
        parser=choice("spread", "max-beta"),
        metavar="spread|max-beta",
        help="Fairness score to minimise: spread (σ profile max - min) or max-beta (max |β_p|).",
    ),
]
Variants = Annotated[
    list[str],
    list_option(
        "--variants",
        choice(*VARIANTS),
        "VARIANT,...",
        "Calibration variants searched jointly at every grid point: uniform (the papers' equal mass per basket), "
        "prior (positional prior, estimated on the dev split), self (self-attention share), special (BOS/EOS share), "
        "or a combination joined with + (prior+special, self+special, prior+self, prior+self+special).",
    ),
]
SelfShares = Annotated[
    list[float],
    list_option(
        "--self-shares", number(0, 1), "RHO,...", "Self-attention shares tried by the self variant (default 0.5,1)."
    ),
]
SpecialShares = Annotated[
    list[str],
    list_option(
        "--special-shares",
        special_share,
        "SHARE,...",
        "BOS/EOS shares tried by the special variant: original, equal or numbers in [0, 1) (default original).",
    ),
]
TrailingPolicies = Annotated[
    list[str],
    list_option(
        "--trailing",
        choice(*TRAILING),
        "POLICY,...",
        "What a short last basket gets, tried at every grid point: basket (the papers': as much as a full "
        "basket), merge (joined to the basket before it), weighted (mass in proportion to its keys) (default basket).",
    ),
]
StrengthSchedules = Annotated[
    list[str],
    list_option(
        "--schedule",
        choice(*SCHEDULES),
        "SCHEDULE,...",
        "How the strength is spread over the calibrated layers, tried at every grid point: flat (the papers': "
        "the strength in each), rising (k-th of K layers: strength k/K), falling (strength (K-k+1)/K) (default flat).",
    ),
]
Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        help="Print every trial as it is evaluated (they are written to OUT/trials.log); without it: the verdict.",
    ),
]
FineRounds = Annotated[
    int,
    typer.Option(
        "--fine-rounds",
        parser=integer(0),
        metavar="N",
        help="Rounds of strength bisection around the best grid setting.",
    ),
]
TunerDocs = Annotated[
    int,
    typer.Option(
        "--docs",
        parser=integer(1),
        metavar="N",
        help="Target documents per instance (each ordering of a segment set is a document; the tuner splits the "
        "sets into dev and test). The default runs in minutes on a CPU; the papers use ~1,000 (--docs 1000).",
    ),
]
TestFraction = Annotated[
    float,
    typer.Option(
        "--test-fraction",
        parser=number(0, 1, low_open=True, high_open=True),
        metavar="F",
        help="Share of segment sets (fairness) or documents' queries (retrieval) held out, in (0, 1).",
    ),
]
TestFamily = Annotated[
    str | None,
    typer.Option(
        "--test-family",
        metavar="FAMILY",
        help="Hold out this document family of the corpus (its 'source' column; the bundled corpus: debian-faq, "
        "installation-guide) as the test split and tune on the others (fairness objective; run once per "
        "family to cross-validate). Default: --test-fraction of the topics.",
    ),
]
SaveModel = Annotated[
    Path | None,
    typer.Option(
        "--save-model",
        metavar="FOLDER",
        help="Save the model with the chosen calibration persisted into this folder.",
    ),
]
SaveModelAnyway = Annotated[
    bool,
    typer.Option(
        "--save-model-anyway",
        help="With --save-model: save the chosen setting even when it fails on the held-out test split (the "
        "constraint broken, or the σ profile reversed beyond noise); without it such a setting is not saved "
        f"and the command exits with {EXIT_NOT_SAVED}.",
    ),
]


def tune(
    model: Model = None,
    corpus: Corpus = None,
    objective: Objective = "fairness",
    benchmark: OptionalBenchmark = None,
    max_recall_drop: MaxRecallDrop = 2.0,
    max_ndcg_drop: MaxNdcgDrop = 2.0,
    score: Score = "spread",
    space: SpaceChoice = "default",
    baskets: Baskets = (),
    layers: LayerSets = (),
    strengths: Strengths = (),
    variants: Variants = (),
    self_shares: SelfShares = (),
    special_shares: SpecialShares = (),
    trailing_policies: TrailingPolicies = (),
    strength_schedules: StrengthSchedules = (),
    fine_rounds: FineRounds = 2,
    n: Ns = (3,),
    lang: Lang = "en",
    docs: TunerDocs = DOCS_DEFAULT,
    test_fraction: TestFraction = 0.5,
    test_family: TestFamily = None,
    seed: Seed = 0,
    batch_size: BatchSize = 32,
    out: OutTune = Path("posfair-tune"),
    cache: Cache = None,
    save_model: SaveModel = None,
    save_model_anyway: SaveModelAnyway = False,
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
    verbose: Verbose = False,
) -> None:
    """Search basket size x layers x strength on a dev split under a constraint; report the Pareto front and the test split."""
    options = TuneOptions(
        out=out,
        model=checks.ModelOptions(
            model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
        ),
        corpus=corpus,
        objective=objective,
        benchmark=benchmark,
        max_recall_drop=max_recall_drop,
        max_ndcg_drop=max_ndcg_drop,
        score=score,
        space=space,
        baskets=baskets,
        layers=layers,
        strengths=strengths,
        variants=variants,
        self_shares=self_shares,
        special_shares=special_shares,
        trailing_policies=trailing_policies,
        strength_schedules=strength_schedules,
        fine_rounds=fine_rounds,
        n=n,
        lang=lang,
        docs=docs,
        test_fraction=test_fraction,
        test_family=test_family,
        seed=seed,
        batch_size=batch_size,
        cache=cache,
        save_model=save_model,
        save_model_anyway=save_model_anyway,
        verbose=verbose,
    )
    tune_run(options)


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """Everything ``posfair tune`` runs with, built once by the command and passed down as one value: the
    combinations of options it refuses are refused when it is made, the benchmark's source, the folders and the
    model's source by :meth:`checked`, before any work."""

    out: Path
    model: checks.ModelOptions
    corpus: str | None = None
    objective: str = "fairness"
    benchmark: str | None = None
    max_recall_drop: float = 2.0
    max_ndcg_drop: float = 2.0
    score: str = "spread"
    space: str = "default"
    baskets: tuple[int, ...] = ()
    layers: tuple = ()
    strengths: tuple[float, ...] = ()
    variants: tuple[str, ...] = ()
    self_shares: tuple[float, ...] = ()
    special_shares: tuple = ()
    trailing_policies: tuple[str, ...] = ()
    strength_schedules: tuple[str, ...] = ()
    fine_rounds: int = 2
    n: tuple[int, ...] = (3,)
    lang: str = "en"
    docs: int = DOCS_DEFAULT
    test_fraction: float = 0.5
    test_family: str | None = None
    seed: int = 0
    batch_size: int = 32
    cache: Path | None = None
    save_model: Path | None = None
    save_model_anyway: bool = False
    verbose: bool = False

    def __post_init__(self) -> None:
        from posfair.cli.error_boundary import PosfairInputError

        for name in ("baskets", "layers", "strengths", "variants", "self_shares", "special_shares",
                     "trailing_policies", "strength_schedules", "n"):  # fmt: skip
            object.__setattr__(self, name, tuple(getattr(self, name)))  # a list from the parser: frozen as a tuple
        if self.benchmark is not None and self.objective != "retrieval":
            raise PosfairInputError(f"--benchmark {self.benchmark} applies only to --objective retrieval")
        if self.save_model_anyway and self.save_model is None:
            raise PosfairInputError("--save-model-anyway: applies only with --save-model FOLDER")
        if self.test_family is not None and self.objective != "fairness":
            raise PosfairInputError(f"--test-family {self.test_family}: applies only to --objective fairness")

    @property
    def max_drop(self) -> float:
        """The constraint's most allowed drop below stock, as a fraction (recall for fairness, nDCG for retrieval)."""
        return (self.max_recall_drop if self.objective == "fairness" else self.max_ndcg_drop) / 100

    @property
    def score_name(self) -> str | None:
        """The tuner's name of ``--score`` (None for the retrieval objective)."""
        return {"spread": "spread", "max-beta": "max_abs_beta"}[self.score] if self.objective == "fairness" else None

    def grid(self):
        """The grid searched: ``--space`` with each axis given on the command line in its place."""
        return _search_space(self.space, self.fine_rounds, self.baskets, self.layers, self.strengths, self.variants,
                             self.self_shares, self.special_shares, self.trailing_policies,
                             self.strength_schedules)  # fmt: skip

    def checked(self) -> TuneOptions:
        """These options once the benchmark's source, the folders and the model's source and device are checked."""
        if self.benchmark is not None:
            checks.benchmark_source(self.benchmark)
        checks.output_folder(self.out, command="tune")
        checks.cache_folder(self.cache)
        if self.save_model is not None:
            checks.output_folder(self.save_model, "--save-model")
        self.model.checked()
        return self


def tune_run(options: TuneOptions) -> None:
    """Check everything, read the data, load the model, tune, and say the verdict (exit 3: the model not saved)."""
    from posfair.cli.error_boundary import data_errors
    from posfair.cli.terminal import error, say

    o = options.checked()
    # the tuner and the pipelines (torch, transformers) are imported only now, after the checks (--help and mistakes stay fast)
    from posfair.tuning import default_fairness_settings
    from posfair.tuning.outputs import summary_text
    from posfair.tuning.tuner import TRIAL_LOG
    from posfair.tuning.tuner import tune as run_tune
    from posfair.tuning.verdicts import ConstraintWarning

    grid = o.grid()
    df, bench = _load_data(o.objective, o.benchmark, o.corpus, o.lang, o.test_family)
    fm = checks.load_model(o.model)
    settings = None
    if o.objective == "fairness":
        settings = default_fairness_settings(
            n_values=o.n, configs=(o.lang,), target_docs=o.docs, seed=o.seed, batch_size=o.batch_size
        )
    if not o.baskets:  # the --space grid: basket sizes no document of this model can fill are left out up front
        grid = _fit_to_model(grid, o.space, fm.max_seq_length)
    t0 = time.perf_counter()
    with data_errors(), warnings.catch_warnings():  # e.g. too few segment sets to split into dev and test
        warnings.simplefilter("ignore", ConstraintWarning)  # the verdict below says each failure once
        result = run_tune(
            fm,
            df,
            objective=o.objective,
            benchmark=bench,
            settings=settings,
            space=grid,
            max_drop=o.max_drop,
            score=o.score_name,
            test_fraction=o.test_fraction,
            seed=o.seed,
            out_dir=o.out,
            cache_dir=o.cache,
            save_model=o.save_model,
            save_anyway=o.save_model_anyway,
            lang=o.lang,
            test_family=o.test_family,
            log=say if o.verbose else None,  # every trial line is in OUT/trials.log
        )
    say(summary_text(result, o.out, log=o.out / TRIAL_LOG) + f" ({time.perf_counter() - t0:.0f} s)")
    if result.save_refused is not None:  # the failure is said above, once
        error(
            f"tuned model not saved to {o.save_model}: {result.chosen_label} fails on the held-out test split "
            "(--save-model-anyway saves it)"
        )
        raise typer.Exit(EXIT_NOT_SAVED)


def _search_space(space, fine_rounds, baskets, layers, strengths, variants, self_shares, special_shares, trailings,
                  schedules):  # fmt: skip
    """The grid searched: ``--space`` (default or paper) with each axis given on the command line in its place."""
    from posfair.tuning import SearchSpace

    base = SearchSpace.paper(fine_rounds) if space == "paper" else SearchSpace(fine_rounds=fine_rounds)
    return SearchSpace(
        basket_sizes=tuple(baskets) or base.basket_sizes,
        layer_sets=tuple(layers) or base.layer_sets,
        strengths=tuple(strengths) or base.strengths,
        fine_rounds=fine_rounds,
        variants=tuple(variants) or ("uniform",),
        self_shares=tuple(self_shares) or base.self_shares,
        special_shares=tuple(special_shares) or base.special_shares,
        trailings=tuple(trailings) or base.trailings,
        schedules=tuple(schedules) or base.schedules,
    )


def _load_data(objective: str, benchmark, corpus, lang: str, test_family: str | None):
    """``(corpus frame, benchmark)``, one of them None: the benchmark of the retrieval objective (its size said),
    else the corpus in ``lang``; ``--test-family`` checked against the corpus's families."""
    from posfair.cli.error_boundary import PosfairInputError, naming
    from posfair.cli.inputs import load_corpus, say_benchmark_size

    df = bench = None
    if objective == "retrieval" and benchmark is not None:
        from posfair.retrieval.benchmarks import load_benchmark

        with naming("--benchmark", benchmark):
            bench = load_benchmark(benchmark)
        say_benchmark_size(bench)  # the tuner halves it into dev and test
    else:
        df = load_corpus(corpus, [lang])
    if test_family is not None:
        from posfair.tuning.objectives import corpus_families

        families = corpus_families(df)
        if test_family not in families or len(families) < 2:
            known = ", ".join(families) if families else "none (no 'source' column)"
            raise PosfairInputError(
                f"--test-family {test_family}: not a document family of the corpus (families: {known}; "
                "holding one out needs at least 2)"
            )
    return df, bench


def _fit_to_model(grid, space_name: str, token_limit: int):
    """:func:`fit_space` with the basket sizes it leaves out said on the terminal."""
    from posfair.cli.terminal import say

    grid, dropped = fit_space(grid, token_limit)
    if dropped:
        say(
            f"basket sizes {', '.join(map(str, dropped))} left out of the --space {space_name} grid: at the "
            f"model's {token_limit}-token limit no document has a basket to calibrate (--baskets tries them)"
        )
    return grid
