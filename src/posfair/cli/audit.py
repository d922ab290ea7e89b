"""``posfair audit``: a model's positional fairness on an aligned corpus, stock vs calibrations.

The run itself and its summary (:func:`posfair.cli.runs.run_audit`) are shared with ``posfair demo``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from posfair.cli import checks, runs
from posfair.cli.inputs import load_corpus
from posfair.cli.options import (
    DOCS_DEFAULT,
    BatchSize,
    BootstrapDraws,
    BootstrapSeed,
    BootstrapWeights,
    Cache,
    Calibrations,
    Clusters,
    Corpus,
    Device,
    Docs,
    Inference,
    Langs,
    MaxSeqLength,
    Model,
    Ns,
    OutFolder,
    Seed,
    TrustRemoteCode,
)
from posfair.cli.parsers import comma_list, integer, joined, lang_code, mixed_config

if TYPE_CHECKING:
    from posfair.fairness.experiment import AuditSettings
    from posfair.stats.inference import Inference as InferenceSpec

Mixed = Annotated[
    list[str],
    typer.Option(
        "--mixed",
        parser=comma_list(mixed_config),
        callback=joined,
        metavar="LEAD:LATER,...",
        show_default="none",
        help="Mixed configurations, comma-separated: LEAD at position 1, LATER after it (e.g. de:en).",
    ),
]
LanguageGrid = Annotated[
    list[str],
    typer.Option(
        "--language-grid",
        parser=comma_list(lang_code),
        callback=joined,
        metavar="LANG,...|all",
        show_default="none",
        help="Audit every language pair: the monolingual baseline of each language and every mixed [LEAD, LATER, ..., "
        "LATER] (k languages: k + k(k-1) configurations); 'all' = every language of the corpus. Adds the language "
        "section (β2 heatmaps, language effect at equal position) to the report.",
    ),
]
MinSegmentTokens = Annotated[
    int | None,
    typer.Option(
        "--min-segment-tokens",
        parser=integer(1),
        metavar="TOKENS",
        show_default="a third of the per-segment budget",
        help="Shortest segment (tokens, no special tokens).",
    ),
]
MaxSegmentTokens = Annotated[
    int | None,
    typer.Option(
        "--max-segment-tokens",
        parser=integer(1),
        metavar="TOKENS",
        show_default="(limit - special tokens) // n",
        help="Longest segment (tokens, no special tokens).",
    ),
]
NoControl = Annotated[bool, typer.Option("--no-control", help="Skip the semantic-fidelity control.")]
ByFamily = Annotated[
    bool,
    typer.Option(
        "--by-family",
        help="Audit each document family separately and pooled (the bundled corpus: the FAQ and the installation "
        "guide): every instance is drawn once per family (--docs documents each), and the report, tables and "
        "families.json give each family's coefficients, their change under calibration, the share removed (with "
        "intervals) and a heterogeneity test across families.",
    ),
]
FamilyField = Annotated[
    str | None,
    typer.Option(
        "--family-field",
        metavar="FIELD",
        show_default="source",
        help="The corpus column naming each topic's document family (with --by-family).",
    ),
]


def audit(
    out: OutFolder = Path("posfair-audit"),
    model: Model = None,
    corpus: Corpus = None,
    n: Ns = (3, 4),
    langs: Langs = (),
    mixed: Mixed = (),
    language_grid: LanguageGrid = (),
    calibration: Calibrations = (),
    docs: Docs = DOCS_DEFAULT,
    seed: Seed = 0,
    batch_size: BatchSize = 32,
    max_seq_length: MaxSeqLength = None,
    min_tokens: MinSegmentTokens = None,
    max_tokens: MaxSegmentTokens = None,
    cache: Cache = None,
    no_control: NoControl = False,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
    inference: Inference = "cluster",
    clusters: Clusters = "conservative",
    bootstrap_draws: BootstrapDraws = None,
    bootstrap_weights: BootstrapWeights = None,
    bootstrap_seed: BootstrapSeed = None,
    by_family: ByFamily = False,
    family_field: FamilyField = None,
) -> None:
    """Audit a model's positional fairness on an aligned corpus (stock vs calibrations). Resumable."""
    options = AuditOptions(
        out=out,
        model=checks.ModelOptions(
            model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
        ),
        corpus=corpus,
        n=n,
        langs=langs,
        mixed=mixed,
        language_grid=language_grid,
        calibrations=calibration,
        docs=docs,
        seed=seed,
        batch_size=batch_size,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
        cache=cache,
        control=not no_control,
        inference=inference,
        clusters=clusters,
        bootstrap_draws=bootstrap_draws,
        bootstrap_weights=bootstrap_weights,
        bootstrap_seed=bootstrap_seed,
        by_family=by_family,
        family_field=family_field,
    )
    audit_run(options)


@dataclasses.dataclass(frozen=True)
class AuditOptions:
    """Everything ``posfair audit`` runs with, built once by the command and passed down as one value: the
    combinations of options it refuses (inference, language configurations, segment lengths, families) are
    refused when it is made, the folders, the model's source and the audit's settings by :meth:`checked`, before
    any work."""

    out: Path
    model: checks.ModelOptions
    corpus: str | None = None
    n: tuple[int, ...] = (3, 4)
    langs: tuple[str, ...] = ()
    mixed: tuple[str, ...] = ()
    language_grid: tuple[str, ...] = ()
    calibrations: tuple = ()
    docs: int = DOCS_DEFAULT
    seed: int = 0
    batch_size: int = 32
    min_tokens: int | None = None
    max_tokens: int | None = None
    cache: Path | None = None
    control: bool = True
    inference: str = "cluster"
    clusters: str = "conservative"
    bootstrap_draws: int | None = None
    bootstrap_weights: str | None = None
    bootstrap_seed: int | None = None
    by_family: bool = False
    family_field: str | None = None

    def __post_init__(self) -> None:
        from posfair.cli.error_boundary import PosfairInputError

        for name in ("n", "langs", "mixed", "language_grid", "calibrations"):
            object.__setattr__(self, name, tuple(getattr(self, name)))  # a list from the parser: frozen as a tuple
        self.inference_spec  # noqa: B018 -- a bootstrap option without --inference wild is refused now
        self.configs  # noqa: B018 -- so is a language grid of one language, or 'all' beside others
        if self.min_tokens is not None and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise PosfairInputError(
                f"--min-segment-tokens {self.min_tokens} is above --max-segment-tokens {self.max_tokens}"
            )
        if self.family_field is not None and not self.by_family:
            raise PosfairInputError(f"--family-field {self.family_field}: applies only with --by-family")

    @property
    def inference_spec(self) -> InferenceSpec:
        """``--inference``, ``--clusters`` and the bootstrap options, checked."""
        return checks.inference_choice(
            self.inference, self.bootstrap_draws, self.bootstrap_weights, self.bootstrap_seed, self.clusters
        )

    @property
    def configs(self) -> tuple[list, bool]:
        """The language configurations asked for and whether the grid is ``all`` (see :func:`_language_configs`)."""
        return _language_configs(self.langs, self.mixed, self.language_grid)

    @property
    def family(self) -> str | None:
        """The corpus column naming the families (None without ``--by-family``)."""
        return (self.family_field or "source") if self.by_family else None

    def settings(self, configs) -> AuditSettings:
        """The audit's settings for these language configurations (refused as ``AuditSettings`` refuses them)."""
        from posfair.fairness.experiment import AuditSettings

        return AuditSettings(
            configs=tuple(configs),
            n_values=self.n,
            target_docs=self.docs,
            seed=self.seed,
            max_seq_length=self.model.max_seq_length,
            min_segment_tokens=self.min_tokens,
            max_segment_tokens=self.max_tokens,
            batch_size=self.batch_size,
            control=self.control,
            family_field=self.family,
        ).with_inference(self.inference_spec)

    def checked(self) -> AuditOptions:
        """These options once the folders and the model's source and device are checked, and the settings where
        the configurations are known before the corpus is read (with ``all`` they come from it)."""
        checks.output_folder(self.out, command="audit")
        checks.cache_folder(self.cache)
        self.model.checked()
        configs, grid_all = self.configs
        if not grid_all:
            self.settings(configs)
        return self


def audit_run(options: AuditOptions) -> None:
    """Check everything, read the corpus, load the model, run the audit and print its summary."""
    o = options.checked()
    # the pipeline (torch, transformers) is imported only now, after the checks (--help and mistakes stay fast)
    configs, grid_all = o.configs
    data, configs = _load_data(o.corpus, configs, grid_all, o.family)
    settings = o.settings(configs)
    fm = checks.load_model(o.model)
    checks.check_calibrations(fm, o.calibrations)
    runs.run_audit(
        fm,
        data,
        settings,
        list(o.calibrations),
        o.out,
        o.cache,
        fm.display_name,
        o.corpus or "bundled",
        "Positional-fairness audit",
    )


def _language_configs(langs, mixed, language_grid) -> tuple[list, bool]:
    """The language configurations asked for (``--lang``, ``--mixed``, ``--language-grid``; English when none) and
    whether the grid is ``all`` (its configurations then come from the corpus)."""
    from posfair.cli.error_boundary import PosfairInputError
    from posfair.fairness.documents import LanguageConfig
    from posfair.fairness.documents import language_grid as grid_configs

    configs = [LanguageConfig.mono(lang) for lang in langs] + [LanguageConfig.parse(m) for m in mixed]
    grid_all = list(language_grid) == ["all"]
    if "all" in language_grid and not grid_all:
        raise PosfairInputError(
            f"--language-grid {','.join(language_grid)}: 'all' stands alone (every language of the corpus)"
        )
    if language_grid and not grid_all and len(language_grid) < 2:
        raise PosfairInputError(
            f"--language-grid {','.join(language_grid)}: a language grid needs at least 2 languages"
        )
    if language_grid and not grid_all:
        configs += list(grid_configs(language_grid))
    if not configs and not grid_all:  # nothing asked: English documents, as attention and estimate-prior
        configs = [LanguageConfig.mono("en")]
    return configs, grid_all


def _load_data(corpus, configs: list, grid_all: bool, family_field: str | None):
    """``(corpus frame, configurations)``: the corpus in the languages the configurations need (every language
    with ``--language-grid all``, whose grid is then added), its families checked with ``--by-family``."""
    from posfair.cli.error_boundary import PosfairInputError
    from posfair.fairness.documents import language_grid as grid_configs

    data = load_corpus(corpus, None if grid_all else sorted({lang for c in configs for lang in c.needed}))
    if grid_all:
        corpus_langs = sorted(data["lang"].astype(str).unique())
        if len(corpus_langs) < 2:
            raise PosfairInputError(
                f"--language-grid all: the corpus has only {corpus_langs}; a language grid needs at least 2 languages"
            )
        configs = configs + list(grid_configs(corpus_langs))
    if family_field is not None:
        check_families(data, family_field, corpus or "bundled")
    return data, configs


def check_families(data, field: str, corpus: str) -> list[str]:
    """The families of ``--family-field`` in the corpus; input errors when the column is absent or holds one family."""
    from posfair.cli.error_boundary import PosfairInputError

    if field not in data.columns:
        raise PosfairInputError(
            f"--family-field {field}: corpus {corpus} has no column {field!r} (columns: {', '.join(map(str, data.columns))})"
        )
    families = sorted(data[field].dropna().astype(str).unique())
    if data[field].isna().any():
        raise PosfairInputError(
            f"--family-field {field}: {int(data[field].isna().sum())} rows of corpus {corpus} have none"
        )
    if len(families) < 2:
        raise PosfairInputError(
            f"--by-family: corpus {corpus} has one family in {field!r} ({', '.join(families)}); there is nothing to compare"
        )
    return families
