"""The runs two commands share: :func:`run_audit` (``posfair audit``, ``posfair demo``) and :func:`run_benchmark`
(``posfair retrieval``, ``posfair sweep``) -- the work, its progress and the summary printed after it.

A CLI-internal module (no command): the commands import it, never each other.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from posfair.cli import checks
from posfair.cli.inputs import say_benchmark_size
from posfair.errors import install_hint

__all__ = ["run_audit", "run_benchmark", "query_prompt", "summary_table", "language_summary_tables"]

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
    say(f"inference: {result.inference_text()}")
    for t in language_summary_tables(result):
        header, body = t.rows()
        table(t.title, header, body, caption=LANGUAGE_CAPTION)
    from posfair.fairness.family_report import family_tables

    for t in family_tables(result):  # an audit run --by-family: each family, pooled, and Cochran's Q across them
        header, body = t.rows()
        table(t.title, header, body, caption=FAMILY_CAPTION)
    cov = result.coverage()
    cov = cov[cov["calibrated_share"].notna()]
    for label, g in cov.groupby("calibration", sort=False):
        docs, done = int(g["documents"].sum()), int(g["calibrated"].sum())
        say(f"calibrated share of {label}: {done / docs:.3f} ({done} of {docs} documents calibrated)")
        words = next((c.describe() for c in calibrations if c.label() == label), None)
        if words:
            say(f"{label}: {words}")
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


def run_benchmark(
    *,
    model,
    benchmark,
    calibrations,
    out,
    cache,
    sea,
    stock,
    prompt,
    batch_size,
    top_k,
    faiss,
    search_scope="domain",
    max_seq_length,
    trust_remote_code,
    device,
    lang,
    corpus_lang,
    domains,
    late=(),
    late_chunks="semantic",
) -> None:
    """Check everything, load the benchmark and the model, run every setting (resumable), print the tables.

    ``calibrations``: a list, or a function making it (called after the checks: ``sweep`` builds its grid with the pipeline's code).
    """
    from posfair.cli.error_boundary import naming

    prompt, model_id = _check_benchmark_options(
        stock, calibrations, sea, late, late_chunks, out, cache, benchmark, faiss, prompt, model, trust_remote_code,
        device,
    )  # fmt: skip
    # the pipeline (torch, transformers) is imported only now, after the checks (--help and mistakes stay fast)

    from posfair.cli.terminal_progress import progress_bars
    from posfair.retrieval.benchmarks import load_benchmark
    from posfair.retrieval.late import LateChunking
    from posfair.retrieval.resumable_sweep import run_sweep
    from posfair.retrieval.sea import SegmentEmbedAverage
    from posfair.store import EmbeddingStore

    calibrations = calibrations() if callable(calibrations) else list(calibrations)
    with naming("--benchmark", benchmark):
        bench = load_benchmark(benchmark, lang=lang, corpus_lang=corpus_lang, domains=list(domains) or None)
    say_benchmark_size(bench)
    fm = checks.load_model(model_id, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device)
    checks.check_calibrations(fm, calibrations)
    with progress_bars() as bar:
        results = run_sweep(
            fm,
            bench,
            calibrations,
            out,
            include_stock=stock,
            sea=SegmentEmbedAverage(batch_size=batch_size) if sea else None,
            late=LateChunking.variants(late, late_chunks, batch_size=batch_size) if late else (),
            store=EmbeddingStore(cache) if cache else None,
            query_prompt=prompt,
            batch_size=batch_size,
            top_k=top_k,
            use_faiss=faiss,
            progress=bar,
            search_scope=search_scope,
        )
    _print_benchmark_results(results, out)


def _check_benchmark_options(stock, calibrations, sea, late, late_chunks, out, cache, benchmark, faiss, prompt, model,
                             trust_remote_code, device):  # fmt: skip
    """The options :func:`run_benchmark` refuses, the folders and extras it checks, before any work; ``(query
    prompt, the model's source)``."""
    from posfair.cli.error_boundary import PosfairInputError

    if not stock and not calibrations and not sea and not late:
        raise PosfairInputError("nothing to evaluate: --no-stock without --calibration, --sea or --late")
    if late_chunks != "semantic" and not late:
        raise PosfairInputError(f"--late-chunks {late_chunks}: applies only with --late max,mean")
    if out is not None:
        checks.output_folder(out)
    checks.cache_folder(cache)
    checks.benchmark_source(benchmark)
    if sea:
        checks.installed("chonkie", "--sea", install_hint("retrieval"))
    if late and late_chunks == "semantic":
        checks.installed("chonkie", "--late with --late-chunks semantic", install_hint("retrieval"))
    if faiss:
        checks.installed("faiss", "--faiss", "pip install faiss-cpu")
    prompt = query_prompt(prompt)
    model_id = checks.model_source(model, trust_remote_code=trust_remote_code)
    checks.device(device)
    return prompt, model_id


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
