"""The runs two commands share: :func:`run_audit` (``posfair audit``, ``posfair demo``) and :func:`run_benchmark`
(``posfair retrieval``, ``posfair sweep``) -- the work, its progress and the summary printed after it.

A CLI-internal module (no command): the commands import it, never each other.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from posfair.cli import checks
from posfair.cli.inputs import say_benchmark_size
from posfair.runtime.errors import install_hint

__all__ = ["run_audit", "BenchmarkOptions", "run_benchmark", "query_prompt", "summary_table", "language_summary_tables"]

SUMMARY_CAPTION = (
    "σ coefficients vs position 1 · marks: none p<0.001, ◊ p<0.01, □ p<0.05, • n.s. · G: clusters the p-values rest on"
)


def summary_table(result) -> tuple[list[str], list[list[str]]]:
    """The headline coefficients of an audit: header and rows (n, configuration, coefficient, each variant, G), the
    rows named as the report's headline names them (``[de, en, en]``, ``β2 (2 vs. 1)``)."""
    from posfair.fairness.audit_tables import headline_table

    hf = headline_table(result.headline_frame(), "").frame
    header = ["n", "configuration", "coefficient", *[str(c) for c in hf.columns]]
    rows = [[str(n), cfg, coef, *[str(v) for v in row.tolist()]] for (n, cfg, coef), row in hf.iterrows()]
    return header, rows


FAMILY_CAPTION = "95 % intervals, t(G-1), the wider of component and two-way clustering · families.json"
LANGUAGE_CAPTION = "marks: none p<0.001, ◊ p<0.01, □ p<0.05, • n.s. · β2 heatmaps in the report"


def language_summary_tables(result) -> list:
    """The language effects at equal position (per n) as report tables; none without a language grid."""
    from posfair.fairness.language_report import language_tables

    return [t for t in language_tables(result) if t.name.startswith(("language_effects", "language_calibrations"))]


def run_audit(
    model, corpus, settings, calibrations, out: Path, cache: Path | None, model_name: str, corpus_name: str, title: str
):
    """Run the audit with progress bars, save its results and report in ``out``, print the summary."""
    from posfair.cli.error_boundary import data_errors
    from posfair.cli.terminal import say, table, warn
    from posfair.cli.terminal_progress import progress_bars
    from posfair.fairness.documents import instance_label
    from posfair.fairness.pipeline import audit as run
    from posfair.stats.inference import FewClustersWarning

    cache = cache or out / "cache"
    t0 = time.perf_counter()
    with progress_bars(complete_on_exit=True) as bar, data_errors():  # e.g. too few segment sets for the settings
        with warnings.catch_warnings():  # the few-clusters warning is printed below, once, as a line of the summary
            warnings.simplefilter("ignore", FewClustersWarning)
            result = run(
                model,
                corpus,
                settings,
                calibrations,
                cache_dir=cache,
                model_name=model_name,
                corpus_name=corpus_name,
                progress=bar,
            )
    paths = result.save(out, title=title, state=[cache])
    elapsed = time.perf_counter() - t0
    header, rows = summary_table(result)
    table(f"{title} ({elapsed:.0f} s)", header, rows, caption=SUMMARY_CAPTION, keys=3)
    if result.inference_summary():  # one line; the report says it in full (what a cluster is, the correction, ...)
        say(f"inference: {result.inference_summary()}; in full in the report")
    for t in language_summary_tables(result):
        header, body = t.rows()
        table(t.title, header, body, caption=LANGUAGE_CAPTION)
    from posfair.fairness.family_report import family_tables

    for t in family_tables(result):  # an audit run --by-family: each family, pooled, and Cochran's Q across them
        header, body = t.rows()
        table(t.title, header, body, caption=FAMILY_CAPTION)
    cov = result.coverage()
    cov = cov[cov["calibrated_share"].notna()]
    for setting, g in cov.groupby("calibration", sort=False):  # each calibration by its one name
        docs, done = int(g["documents"].sum()), int(g["calibrated"].sum())
        say(f"calibrated share of {setting}: {done / docs:.3f} ({done} of {docs} documents calibrated)")
        words = next((c.describe() for c in calibrations if c.label() == setting), None)
        if words:
            say(f"{setting}: {words}")
    few = result.few_clusters_message()
    if few:
        warn(few)
    for s in result.sampling:
        line = f"{instance_label(s['n'], s['config'], s.get('family', ''))}: {s['documents']} documents from {s['sets_used']} segment sets"
        if s["sets_skipped_too_long"]:
            line += f", {s['sets_skipped_too_long']} sets skipped (longer than {s['limit']} tokens)"
        if s["segments_outside_window"]:
            line += f", {s['segments_outside_window']} topics outside the segment-length window"
        say(line)
        for note in s.get("notes", []):
            say(f"  {note}")
    say(f"report: {paths['report']}")
    return result, paths, elapsed


def query_prompt(text: str) -> str | None:
    """``--query-prompt``: ``auto``, ``none`` or a string in which ``\\n`` and other escapes are read."""
    from posfair.cli.error_boundary import input_error

    if text.lower() == "none":
        return None
    if text == "auto":
        return "auto"
    try:
        return text.encode().decode("unicode_escape")
    except UnicodeDecodeError as exc:
        raise input_error("--query-prompt", repr(text), f"bad escape ({exc.reason})") from None


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions:
    """Everything ``posfair retrieval`` and ``posfair sweep`` run with, built once by the command and passed down
    as one value: the combinations of options it refuses are refused when it is made, the folders, extras and
    the model's source by :meth:`checked`, before any work.

    ``calibrations``: the settings, or a function making them (called after the checks: ``sweep`` builds its grid
    with the pipeline's code).  ``query_prompt``: as given (``auto``, ``none`` or a string with escapes), read by
    :attr:`prompt`.
    """

    benchmark: str
    model: checks.ModelOptions
    out: Path
    calibrations: tuple | Callable[[], list] = ()
    cache: Path | None = None
    stock: bool = True
    sea: bool = False
    late: tuple[str, ...] = ()
    late_chunks: str | int = "semantic"
    query_prompt: str = "auto"
    batch_size: int = 32
    top_k: int = 100
    faiss: bool = False
    search_scope: str = "domain"
    lang: str | None = None
    corpus_lang: str | None = None
    domains: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from posfair.cli.error_boundary import PosfairInputError

        for name in ("late", "domains") + (() if callable(self.calibrations) else ("calibrations",)):
            object.__setattr__(self, name, tuple(getattr(self, name)))  # a list from the parser: frozen as a tuple
        if not self.stock and not self.calibrations and not self.sea and not self.late:
            raise PosfairInputError("nothing to evaluate: --no-stock without --calibration, --sea or --late")
        if self.late_chunks != "semantic" and not self.late:
            raise PosfairInputError(f"--late-chunks {self.late_chunks}: applies only with --late max,mean")
        query_prompt(self.query_prompt)  # a bad escape is refused now

    @property
    def prompt(self) -> str | None:
        """The query prompt the evaluation gives the model (None: none; ``auto``: the model's own)."""
        return query_prompt(self.query_prompt)

    def checked(self) -> BenchmarkOptions:
        """These options once the folders, the benchmark's source, the extras they need and the model's source and
        device are checked."""
        if self.out is not None:
            checks.output_folder(self.out, command="retrieval")  # sweep too: one kind of run folder
        checks.cache_folder(self.cache)
        checks.benchmark_source(self.benchmark)
        if self.sea:
            checks.installed("chonkie", "--sea", install_hint("retrieval"))
        if self.late and self.late_chunks == "semantic":
            checks.installed("chonkie", "--late with --late-chunks semantic", install_hint("retrieval"))
        if self.faiss:
            checks.installed("faiss", "--faiss", "pip install faiss-cpu")
        self.model.checked()
        return self


def run_benchmark(options: BenchmarkOptions) -> None:
    """Check everything, load the benchmark and the model, run every setting (resumable), print the tables."""
    from posfair.cli.error_boundary import naming

    o = options.checked()
    # the pipeline (torch, transformers) is imported only now, after the checks (--help and mistakes stay fast)

    from posfair.cli.terminal_progress import progress_bars
    from posfair.retrieval.benchmarks import load_benchmark
    from posfair.retrieval.late import LateChunking
    from posfair.retrieval.resumable_sweep import run_sweep
    from posfair.retrieval.sea import SegmentEmbedAverage
    from posfair.store import EmbeddingStore

    calibrations = o.calibrations() if callable(o.calibrations) else list(o.calibrations)
    with naming("--benchmark", o.benchmark):
        bench = load_benchmark(o.benchmark, lang=o.lang, corpus_lang=o.corpus_lang, domains=list(o.domains) or None)
    say_benchmark_size(bench)
    fm = checks.load_model(o.model)
    checks.check_calibrations(fm, calibrations)
    with progress_bars() as bar:
        results = run_sweep(
            fm,
            bench,
            calibrations,
            o.out,
            include_stock=o.stock,
            sea=SegmentEmbedAverage(batch_size=o.batch_size) if o.sea else None,
            late=LateChunking.variants(o.late, o.late_chunks, batch_size=o.batch_size) if o.late else (),
            store=EmbeddingStore(o.cache) if o.cache else None,
            query_prompt=o.prompt,
            batch_size=o.batch_size,
            top_k=o.top_k,
            use_faiss=o.faiss,
            progress=bar,
            search_scope=o.search_scope,
        )
    _print_benchmark_results(results, o.out)


def _print_benchmark_results(results, out) -> None:
    """The group and bucket tables (one legend for both, of what they show), the differences, the calibrations that
    changed nothing (one line; their rows are in the files' tables) and where the results are."""
    from posfair.calibration.coverage import NOOP_LABEL
    from posfair.cli.terminal import frame, say
    from posfair.retrieval.compare import differences_table
    from posfair.retrieval.result_tables import bucket_table, group_table, results_table
    from posfair.retrieval.resumable_sweep import BUCKETS_TITLE, GROUPS_TITLE, noop_settings

    legend: list[str] = []
    noop = noop_settings(results)  # said in one line below, not as rows of dashes
    for build, present in (
        (group_table, any(r.groups for r in results)),
        (bucket_table, any(r.buckets for r in results)),
    ):
        if present:
            title = (GROUPS_TITLE if build is group_table else BUCKETS_TITLE).format(benchmark=results[0].benchmark)
            rows = build(results)
            table = results_table(rows[~rows["setting"].isin(noop)].reset_index(drop=True))
            frame(title, table.frame)
            legend += [line for line in table.caption.splitlines() if line not in legend]
    if legend:  # once for both tables (the files' tables carry it each)
        say("\n".join(legend))
    differences = differences_table(results)
    if differences is not None:
        frame(differences.title, differences.frame, caption=differences.caption)
    if noop:
        n_cal = sum(r.method == "calibrated" for r in results)
        say(
            f"{len(noop)} of {n_cal} calibrations change no document of this benchmark ({NOOP_LABEL}; every document is shorter "
            f"than one basket or exactly one basket) and were not evaluated: {', '.join(noop)}"
        )
    say(f"results in {out}")
