"""``posfair audit``: a model's positional fairness on an aligned corpus, stock vs calibrations.

The run itself and its summary (:func:`posfair.cli.runs.run_audit`) are shared with ``posfair demo``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    inference_kw = checks.inference_settings(inference, bootstrap_draws, bootstrap_weights, bootstrap_seed, clusters)
    configs, grid_all = _language_configs(langs, mixed, language_grid)
    family_field = _check_options(min_tokens, max_tokens, by_family, family_field, out, cache)
    model_options = checks.ModelOptions(
        model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
    ).checked()
    # the pipeline (torch, transformers) is imported only now, after the checks (--help and mistakes stay fast)
    from posfair.fairness.experiment import AuditSettings

    settings_kw = dict(
        n_values=tuple(n),
        target_docs=docs,
        seed=seed,
        max_seq_length=max_seq_length,
        min_segment_tokens=min_tokens,
        max_segment_tokens=max_tokens,
        batch_size=batch_size,
        control=not no_control,
        family_field=family_field,
        **inference_kw,
    )
    if not grid_all:  # validated before the corpus is read (with 'all' the configurations come from it)
        AuditSettings(configs=tuple(configs), **settings_kw)
    data, configs = _load_data(corpus, configs, grid_all, family_field)
    settings = AuditSettings(configs=tuple(configs), **settings_kw)
    fm = checks.load_model(model_options)
    checks.check_calibrations(fm, calibration)
    name = fm.display_name
    runs.run_audit(
        fm, data, settings, list(calibration), out, cache, name, corpus or "bundled", "Positional-fairness audit"
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


def _check_options(min_tokens, max_tokens, by_family: bool, family_field, out, cache) -> str | None:
    """The segment lengths and family options ``audit`` refuses and the folders it checks, before any work; the
    family column (None without ``--by-family``)."""
    from posfair.cli.error_boundary import PosfairInputError

    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise PosfairInputError(f"--min-segment-tokens {min_tokens} is above --max-segment-tokens {max_tokens}")
    if family_field is not None and not by_family:
        raise PosfairInputError(f"--family-field {family_field}: applies only with --by-family")
    family_field = (family_field or "source") if by_family else None
    checks.output_folder(out)
    checks.cache_folder(cache)
    return family_field


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
