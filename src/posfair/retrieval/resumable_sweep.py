"""Calibration sweeps: the paper's grid and the fine strength sweep, resumable.

Layout of a sweep directory::

    OUT/
      posfair-run.json        the files of the last run with their SHA-256 (posfair.files.run_folder)
      retrieval.json          what the results are computed from: the model's fingerprint, the benchmark's
                              content fingerprint (documents, queries, qrels, positions), top_k, the query
                              prompt, the search scope, posfair's result format (checked on resume), settings
      embeddings/             the EmbeddingStore (queries once, documents per setting)
      runs/<setting>.json     one RetrievalResult per setting (written atomically when done), with the
                              fingerprint of retrieval.json's key: read back only by a sweep of the same key
                              (a calibration that changes no document of the benchmark is
                              recorded with calibrated_share 0 and not evaluated: "no-op")
      table_groups.{csv,md,tex}   Table 1 layout (benchmarks with positional groups)
      table_differences.{csv,md,tex}  every setting minus stock, with paired bootstrap intervals
      table_buckets.{csv,md,tex}  Table 2 layout (PosIR-style benchmarks)
      strength.png            Figure 3 (when the settings include a strength series)

A killed sweep is re-run with the same command: finished settings are read from
``runs/``, the unfinished one resumes from the embeddings already stored, and the
tables are rebuilt from all runs, so they are identical to an uninterrupted run.
A folder holding a sweep made from anything else (another model, benchmark content,
top_k, prompt, scope or result format) is refused with one line naming what differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posfair.calibration import STOCK, Calibration
from posfair.calibration.coverage import NOOP_LABEL
from posfair.encoding import sharing_stock_layers
from posfair.files.atomic import atomic_write_json
from posfair.files.run_folder import RESULT_FORMAT, RunFolder, content_fingerprint
from posfair.model import model_fingerprint
from posfair.report.tables import write_table
from posfair.retrieval.benchmarks import RetrievalBenchmark
from posfair.retrieval.compare import differences_table
from posfair.retrieval.evaluator import DocumentStrategy, PositionalRetrievalEvaluator, RetrievalResult
from posfair.retrieval.grids import paper_grid, strength_sweep
from posfair.retrieval.late import LateChunking
from posfair.retrieval.result_tables import bucket_table, group_table, plot_strength_curves, results_table
from posfair.retrieval.sea import SegmentEmbedAverage
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import ProgressCallback
from posfair.store import EmbeddingStore

# paper_grid and strength_sweep (defined in posfair.retrieval.grids) are importable from here too
__all__ = ["paper_grid", "strength_sweep", "run_sweep", "write_results", "noop_settings"]

logger = logging.getLogger(__name__)


def _run_name(ev: PositionalRetrievalEvaluator) -> str:
    if ev.method == "stock":
        return "stock"
    if ev.method == "sea":
        blob = json.dumps(ev.sea.config(), sort_keys=True)
        return "sea-" + hashlib.sha256(blob.encode()).hexdigest()[:12]
    if ev.method == "late":
        return f"late-{ev.late.aggregate}-" + hashlib.sha256(ev.late.key().encode()).hexdigest()[:12]
    return f"{ev.calibration.label()}-{ev.calibration.key()}"


GROUPS_TITLE = "{benchmark} - nDCG@10 per positional group (x100), Harm (x100), PSI"
BUCKETS_TITLE = "{benchmark} - PSI per length bucket and its change vs stock, aggregate nDCG@10 (x100) and its change"


def write_results(
    results: Sequence[RetrievalResult], out_dir: str | Path, plot_basket: int | None = None
) -> list[Path]:
    """Tables (``table_groups`` / ``table_buckets``: Markdown, CSV, LaTeX through
    :func:`posfair.report.tables.write_table`), and the strength plot when some basket
    size has >= 2 strengths (default: the one with most)."""
    out = Path(out_dir)
    written: list[Path] = []
    name = results[0].benchmark if results else ""
    for stem, build, title, present in (
        ("table_groups", group_table, GROUPS_TITLE, any(r.groups for r in results)),
        ("table_buckets", bucket_table, BUCKETS_TITLE, any(r.buckets for r in results)),
    ):
        if present:
            table = results_table(build(results), title=title.format(benchmark=name), name=stem)  # legend: caption
            written += write_table(table, out, stem).values()
    differences = differences_table(results)
    if differences is not None:
        written += write_table(differences, out, differences.name).values()
    series: dict[int, set] = {}
    for r in results:
        if r.method == "calibrated" and not r.noop:
            series.setdefault(r.calibration["basket_size"], set()).add(r.calibration["strength"])
    # a strength series (2 strengths or more) of some basket size draws the figure; every basket size is in it
    # (plot_basket: only that one), so that every evaluated calibration is in some figure
    drawn = series if plot_basket is None else {plot_basket: series.get(plot_basket, set())}
    if (
        any(r.groups for r in results)
        and any(r.method == "stock" for r in results)
        and any(len(s) >= 2 for s in drawn.values())
    ):
        written.append(plot_strength_curves(results, out / "strength.png", basket_size=plot_basket))
    return written


def _stock_pass_if_worth_it(model: Any, evaluators: list[PositionalRetrievalEvaluator], out: Path) -> bool:
    """When the stock documents come from the store, the calibrations to encode would start from layer 0: a stock pass
    (its vectors discarded) lets them start at their first calibrated layer instead.  Run when the layers it saves
    (the first calibrated layers of the calibrations whose documents are all still to encode) outnumber the layers it
    costs (the model's).  Returns whether it ran."""
    starts = getattr(getattr(model, "transformer_module", None), "first_calibrated_layer", None)
    if starts is None or not evaluators or evaluators[0].method != "stock":
        return False
    stock, corpus = evaluators[0], len(set(evaluators[0].benchmark.corpus_texts))
    if stock.documents_to_encode(model) and not (out / "runs" / f"{_run_name(stock)}.json").exists():
        return False  # the stock run encodes them itself
    saved = sum(
        starts(ev.calibration) or 0
        for ev in evaluators
        if ev.method == "calibrated"
        and not (out / "runs" / f"{_run_name(ev)}.json").exists()
        and ev.calibrated_share(model)
        and ev.documents_to_encode(model) == corpus
    )
    if saved <= model.num_layers:
        return False
    logger.info(
        "%s: a stock pass over the documents (stored already) so that the calibrations start above layer 0",
        stock.benchmark.name,
    )
    stock.stock_pass(model)
    return True


def run_sweep(
    model: Any,
    benchmark: RetrievalBenchmark,
    calibrations: Sequence[Calibration],
    out_dir: str | Path,
    *,
    include_stock: bool = True,
    sea: SegmentEmbedAverage | None = None,
    late: Sequence[LateChunking] = (),
    store: EmbeddingStore | None = None,
    query_prompt: str | None = "auto",
    batch_size: int = 32,
    top_k: int = 100,
    use_faiss: bool = False,
    show_progress_bar: bool | None = None,
    encode_chunk: int = 256,
    progress: ProgressCallback | None = None,
    search_scope: str = "domain",
) -> list[RetrievalResult]:
    """Evaluate stock (+ SEA) (+ every late-chunking strategy in ``late``) + every calibration on ``benchmark``;
    resumable; writes tables.

    ``show_progress_bar`` / ``progress``: as :class:`PositionalRetrievalEvaluator` (tqdm bars
    of each setting's encoding, shown by default when this module's logger is at INFO or
    DEBUG; or the caller's ``progress(description, total, already_done)``).

    A calibration whose calibrated share of the benchmark's documents is 0 (every document
    shorter than one basket, or exactly one basket) is not evaluated: it is recorded as a
    no-op (``RetrievalResult.noop``) and marked so in the tables, never shown as a result.
    """
    out = Path(out_dir)
    store = store or EmbeddingStore(out / "embeddings")
    fp = model_fingerprint(model)
    settings = _sweep_settings(calibrations, include_stock, sea, late)
    evaluators = [
        PositionalRetrievalEvaluator(
            benchmark,
            documents,
            query_prompt=query_prompt,
            store=store,
            batch_size=batch_size,
            top_k=top_k,
            use_faiss=use_faiss,
            show_progress_bar=show_progress_bar,
            encode_chunk=encode_chunk,
            report_fallback=False,
            progress=progress,
            search_scope=search_scope,
        )
        for documents in settings
    ]
    manifest = _sweep_manifest(model, fp, benchmark, evaluators, top_k, search_scope)
    key = {k: manifest[k] for k in _SWEEP_KEY}
    manifest["settings"] = _check_resumable(out, key, manifest["settings"])
    sweep_fp = content_fingerprint(key)
    state = ["runs", *([store.root] if hasattr(store, "root") else [])]
    with RunFolder(out, "retrieval", key, state=state):
        _write_key_file(out, manifest)
        results, shared = _evaluate_settings(model, evaluators, settings, out, sweep_fp)
        _report_partial_runs(results, benchmark)
        write_results(results, out)
    if shared is not None:
        logger.debug("%s: %s", benchmark.name, shared.summary())
    return results


def _sweep_settings(
    calibrations: Sequence[Calibration],
    include_stock: bool,
    sea: SegmentEmbedAverage | None,
    late: Sequence[LateChunking],
) -> list[DocumentStrategy]:
    """The sweep's settings in their order: stock, SEA, each late-chunking strategy, each calibration (duplicates
    dropped); ValueError when there is none."""
    settings: list[DocumentStrategy] = []
    if include_stock:
        settings.append(STOCK)
    if sea is not None:
        settings.append(sea)
    settings += list({lc.key(): lc for lc in late}.values())
    settings += list({c.key(): c for c in calibrations}.values())
    if not settings:
        raise ValueError("nothing to run: no calibration, stock run disabled, no SEA and no late chunking")
    return settings


def _sweep_manifest(
    model: Any,
    fp: str,
    benchmark: RetrievalBenchmark,
    evaluators: list[PositionalRetrievalEvaluator],
    top_k: int,
    search_scope: str,
) -> dict[str, Any]:
    """What the sweep's results are computed from (its key, :data:`_SWEEP_KEY`) and its settings' run names."""
    return {
        "model": fp,
        "max_seq_length": model.max_seq_length,
        "benchmark": benchmark.summary() | {"fingerprint": benchmark.fingerprint()},
        "top_k": top_k,
        "query_prompt": evaluators[0]._query_prompt(model),
        "search_scope": search_scope,
        "result_format": RESULT_FORMAT,
        "settings": [_run_name(e) for e in evaluators],
    }


def _write_key_file(out: Path, manifest: dict[str, Any]) -> None:
    """Write retrieval.json; a former sweep.json is removed (its content was checked and is now in retrieval.json)."""
    former = _key_file(out)
    atomic_write_json(out / SWEEP_FILE, manifest)
    if former.name == FORMER_SWEEP_FILE:
        former.unlink(missing_ok=True)


def _evaluate_settings(
    model: Any,
    evaluators: list[PositionalRetrievalEvaluator],
    settings: list[DocumentStrategy],
    out: Path,
    sweep_fp: str,
) -> tuple[list[RetrievalResult], Any]:
    """Each setting's result: read back from ``runs/`` when this sweep finished it, else evaluated (a no-op
    calibration recorded, not evaluated) and written there.  Also returns the stock layers shared (or None)."""
    results = []
    # stock runs first: its layers below the calibrations' first calibrated layer serve them all (posfair.model.stock_layers)
    with sharing_stock_layers(model, [c for c in settings if isinstance(c, Calibration)]) as shared:
        _stock_pass_if_worth_it(model, evaluators, out)
        for ev in evaluators:
            run_path = out / "runs" / f"{_run_name(ev)}.json"
            done = _finished_run(run_path, sweep_fp)
            if done is not None:
                results.append(done)
                continue
            share = ev.calibrated_share(model)
            name = ev.benchmark.name
            logger.info("%s: %s%s", name, ev.setting, f" ({NOOP_LABEL}, not evaluated)" if share == 0 else "")
            result = ev.noop_result(share) if share == 0 else ev.evaluate(model)
            atomic_write_json(run_path, result.to_dict() | {"sweep": sweep_fp})
            results.append(result)
    return results, shared


#: what a sweep's results are computed from besides each setting: a folder holding a sweep of other values is refused
_SWEEP_KEY = ("model", "max_seq_length", "benchmark", "top_k", "query_prompt", "search_scope", "result_format")
SWEEP_FILE = "retrieval.json"
#: the key file's former name (posfair before issue 40): read when the folder has no retrieval.json, replaced on write
FORMER_SWEEP_FILE = "sweep.json"


def _key_file(out: Path) -> Path:
    """The folder's key file: retrieval.json, else the former sweep.json of a folder an older posfair wrote."""
    path = out / SWEEP_FILE
    return path if path.exists() or not (out / FORMER_SWEEP_FILE).exists() else out / FORMER_SWEEP_FILE


def _check_resumable(out: Path, key: dict[str, Any], settings: list[str]) -> list[str]:
    """The settings of the sweep in ``out`` and this one; PosfairInputError naming what differs when ``out``
    holds a sweep made from another model, benchmark content or search (its runs cannot be reused)."""
    path = _key_file(out)
    if not path.exists():
        return settings
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PosfairInputError(f"{path}: unreadable ({exc}); move the folder away or choose another --out") from None
    old.setdefault("search_scope", "domain")  # sweeps before the option searched per domain
    new = json.loads(json.dumps(key, default=str))
    differ = [k for k in _SWEEP_KEY if old.get(k) != new[k]]
    if differ:
        what = {
            "benchmark": "a different benchmark content (documents, queries, qrels or positions)"
            if (old.get("benchmark") or {}).get("name") == key["benchmark"]["name"]
            else f"a different benchmark ({(old.get('benchmark') or {}).get('name')!r})",
            "model": "a different model (weights or configuration)",
            "result_format": "an older posfair result format",
        }
        said = "; ".join(what.get(k, f"a different {k} ({old.get(k)!r})") for k in differ)
        raise PosfairInputError(
            f"{out} holds retrieval results made from {said}: they cannot be reused; "
            "choose another --out (or move that folder away)"
        )
    return list(dict.fromkeys(old.get("settings", []) + settings))


def _finished_run(path: Path, sweep_fp: str) -> RetrievalResult | None:
    """A finished setting's result, when ``path`` holds one of this sweep (its fingerprint matches); else None."""
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        if body.get("sweep") == sweep_fp:
            return RetrievalResult.from_dict(body)
        why = "made by another sweep"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"unreadable ({type(exc).__name__})"
    logger.warning("%s: %s; the setting is evaluated again", path, why)
    return None


def _report_partial_runs(results: list[RetrievalResult], benchmark: RetrievalBenchmark) -> None:
    noop = noop_settings(results)
    if noop:
        logger.warning(
            "%d of %d calibrations change no document of %s (%s), not evaluated: %s",
            len(noop),
            sum(r.method == "calibrated" for r in results),
            benchmark.name,
            NOOP_LABEL,
            ", ".join(noop),
            extra={"posfair_summary": True},  # the command line says it in its summary (posfair retrieval, sweep)
        )
    partial = [
        f"{r.setting} ({r.calibrated_share:.3f})"
        for r in results
        if r.calibrated_share is not None and 0 < r.calibrated_share < 1
    ]
    if partial:
        logger.info(
            "calibrations that change only part of the documents of %s (calibrated share): %s",
            benchmark.name,
            ", ".join(partial),
        )


def noop_settings(results: Sequence[RetrievalResult]) -> list[str]:
    """Labels of the calibrations that changed no document (calibrated share 0)."""
    return [r.setting for r in results if r.noop]
