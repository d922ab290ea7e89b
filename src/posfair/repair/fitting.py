"""Fit a repair on some document families, judge it on another, save it only when it holds (``posfair fit``).

:func:`fit_repair` runs one method (:data:`METHODS`) on the train / dev split of :func:`~posfair.repair.data.repair_split`,
saves the repaired model to a candidate folder, loads it back as a user would (``posfair.load_model``) and
judges it against stock on the held-out family (:mod:`posfair.repair.heldout`): bias removed per position with
intervals, reversal, own-segment recall@1, own segment above every foreign one, nDCG@10 on a benchmark built
from the held-out family, and the encode cost against stock.  The candidate becomes the model folder ``out_dir``
only when :func:`~posfair.repair.heldout.check_repair` finds nothing (or ``save_failing``), whole or not at all
("Saving whole" below).  The report (``out_dir/fit/``: ``heldout.json``, ``heldout.md``) is written either way.

Methods (each fitted on the same documents, judged by the same checks):

* ``finetune``: position-balanced fine-tuning (:mod:`posfair.repair.finetune`); a plain sentence-transformers
  folder;
* ``learned``: calibration strengths per layer and head fitted by gradient (:func:`posfair.repair.learned.fit_learned`);
* ``tempscale``: TempScale's softmax temperature chosen on dev (:func:`posfair.repair.learned.fit_tempscale`);
* ``grid``: the papers' grid as ``posfair tune`` searches it, on the fit families (the baseline).

Saving whole (:func:`publish`, :func:`recover`).  The ``--out`` folder is the model folder itself (plain
``SentenceTransformer(DIR)`` loads it) and may hold other things: ``DIR/fit/`` (the fit's report) and files of the
user's own.  No single rename can replace some entries of a folder and keep the others, so the new model's entries
are put in place one by one under a journal:

1. the new model is whole in ``DIR/.posfair-save/new`` (the fit's candidate folder, renamed there);
2. the current model's entries are linked (hard links, else copied) into ``DIR/.posfair-save/old``: a whole copy;
3. the journal ``DIR/.posfair-save/journal.json`` is written (atomically): from here on ``posfair.load_model(DIR)``
   loads the copy in ``old`` (:func:`posfair.model.fair_model.published_folder`), whatever state ``DIR``'s own
   entries are in;
4. each of the new model's entries replaces ``DIR``'s (one rename each), the previous model's other entries go,
   and ``DIR/.posfair-model.json`` records which entries of ``DIR`` are the model's;
5. the journal is removed: that one unlink publishes the new model; then ``DIR/.posfair-save`` goes.

A run killed anywhere leaves ``DIR`` loadable by ``posfair.load_model`` as the whole previous model (or, before a
first model, as none) until the journal's removal, and as the whole new one after it.  :func:`recover` (run at the
start of every ``posfair fit --out DIR``) finds what a killed save left: with its journal, the previous model's
entries are put back from ``old`` (the killed fit's report never got written either: model and report stay a pair)
and then the journal goes; without one, ``DIR/.posfair-save`` is only a leftover and is removed.

The model's entries are the names its folder holds; a name of ``DIR`` that the new model also writes is the
model's (it is replaced, and put back if the save is undone); every other entry of ``DIR`` is left alone, except
the previous model's own as recorded in ``DIR/.posfair-model.json`` by the save that wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from posfair.calibration import STOCK
from posfair.corpus import load_corpus
from posfair.encoding.passes import encode_texts, l2_normalize
from posfair.files.atomic import atomic_write_text
from posfair.model import load_model
from posfair.model.fair_model import SAVING_FOLDER, SAVING_JOURNAL, SAVING_OLD
from posfair.repair.data import FAMILY_FIELD, RepairSplit, repair_split
from posfair.repair.family_benchmark import TITLE_NDCG, heldout_ndcg
from posfair.repair.figure import repair_tradeoff
from posfair.repair.finetune import FinetuneSettings, LoraSettings, add_lora, check_lora_targets, fit_finetune
from posfair.repair.grid import grid_choice
from posfair.repair.heldout import (
    HeldOut,
    PositionEffect,
    RepairLimits,
    RetrievalChange,
    check_repair,
    effect_words,
    evaluate_repair,
    set_units,
)
from posfair.repair.learned import fit_learned, fit_tempscale
from posfair.repair.queries import query_changes
from posfair.runtime.errors import PosfairInputError

__all__ = ["DEFAULT_METHOD", "METHODS", "RECORD", "FitResult", "fit_repair", "heldout_markdown", "publish", "recover"]

log = logging.getLogger(__name__)

Method = Literal["finetune", "learned", "tempscale", "grid"]
METHODS: tuple[Method, ...] = ("finetune", "learned", "tempscale", "grid")
#: the method that held best on the bundled corpus's own family split (README, "Repairing a model")
DEFAULT_METHOD: Method = "finetune"

#: progress(what, step, total, objective): the fit's progress (objective NaN where a step has none)
FitProgress = Callable[[str, int, int, float], None]


@dataclass
class FitResult:
    """What :func:`fit_repair` did: the method, what it fitted (``fitted``: the calibration's spec, or the
    fine-tuning's settings), the held-out evaluation, the checks it failed, whether the folder was saved."""

    method: str
    model: str
    test_family: str
    counts: dict[str, tuple[int, int]]
    fitted: dict[str, Any]
    heldout: HeldOut
    ndcg: dict[str, float] | None
    failures: list[str]
    saved: bool
    fit_seconds: float
    encode_ratio: float
    out_dir: str
    limits: RepairLimits = field(default_factory=RepairLimits)
    #: the fitting process's peak resident memory (MiB) when the result was made
    peak_rss_mib: float = float("nan")
    #: the document families fitted on (train and dev)
    fit_families: tuple[str, ...] = ()
    #: stock's translation -> English recall@1 per language on the held-out family (posfair.repair.queries)
    translations_found: dict[str, float] = field(default_factory=dict)
    #: whether that makes the model multilingual: the cross-language measures are then in ``heldout.retrieval``
    multilingual: bool = False
    #: what the report must say beside the table (cross-language checks skipped, and why)
    notes: tuple[str, ...] = ()

    #: the size of the repaired model's folder (MiB; an adapter folder holds the adapter alone)
    folder_mib: float = float("nan")

    @property
    def holds(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["heldout"] = self.heldout.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitResult:
        """The result :meth:`to_dict` wrote (``heldout.json``)."""
        h = dict(d["heldout"])
        heldout = HeldOut(
            **{**h, "positions": tuple(PositionEffect.from_dict(e) for e in h["positions"]),
               "retrieval": tuple(RetrievalChange(**r) for r in h["retrieval"]),
               "above_by_position": tuple(tuple(x) for x in h.get("above_by_position", ()))}
        )  # fmt: skip
        counts = {k: tuple(v) for k, v in d["counts"].items()}
        return cls(**{**d, "heldout": heldout, "counts": counts, "limits": RepairLimits(**d["limits"]),
                      "fit_families": tuple(d.get("fit_families", ())), "notes": tuple(d.get("notes", ()))})  # fmt: skip


def _fit_method(
    method: Method,
    model,
    split: RepairSplit,
    fit_corpus: pd.DataFrame,
    work: Path,
    progress: FitProgress | None,
    steps: int | None,
    lora: LoraSettings | None = None,
    base: str = "",
):
    """Run ``method`` (``finetune`` with ``lora``: a LoRA adapter of the base model ``base``): returns (the repaired
    model, what was fitted as plain values)."""
    report = None if progress is None else (lambda step, total, value: progress(method, step, total, value))
    if method == "finetune":
        settings = FinetuneSettings()
        if steps is not None:
            settings = dataclasses.replace(settings, steps=steps, eval_every=min(settings.eval_every, steps))
        if lora is not None:
            settings = dataclasses.replace(settings, learning_rate=lora.learning_rate)
            add_lora(model, lora, base)
        fit_finetune(model, split.train, split.dev, str(work / "checkpoints"), settings, progress=report)
        return model, {"finetune": settings.to_dict(), **({"lora": lora.to_dict()} if lora else {})}
    if method in ("learned", "tempscale"):
        if method == "learned":
            extra = {} if steps is None else {"steps": steps}
            cal = fit_learned(model, list(split.train), list(split.dev), progress=report, **extra)
        else:
            cal = fit_tempscale(model, list(split.train), list(split.dev), progress=report)
    else:
        cal = grid_choice(model, fit_corpus, work / "grid", limit=model.max_seq_length)
    model.set_calibration(cal)
    return model, {"calibration": "stock" if cal is STOCK else cal.spec()}


def fit_repair(
    model_id: str | None,
    out_dir: str | Path,
    *,
    corpus: pd.DataFrame | None = None,
    method: Method = DEFAULT_METHOD,
    test_family: str | None = None,
    limits: RepairLimits | None = None,
    max_seq_length: int = 512,
    save_failing: bool = False,
    progress: FitProgress | None = None,
    steps: int | None = None,
    seed: int = 0,
    lora: LoraSettings | None = None,
) -> FitResult:
    """Fit ``method`` on ``corpus`` (default: the bundled corpus, English) for the model ``model_id`` (as
    :func:`posfair.load_model` takes it) and save the repaired model to ``out_dir`` when it holds on the held-out
    family (module docstring).  ``max_seq_length``: the documents' token limit during the fit and the judgement (the
    saved folder keeps the model's own limit).  ``steps``: the optimiser steps of ``finetune`` and ``learned`` (None:
    the method's default).  ``lora``: ``finetune`` trains a LoRA adapter alone and saves an adapter folder (its
    targets checked against the model right after it loads, before any work)."""
    if method not in METHODS:
        raise PosfairInputError(f"--method {method!r}: one of {', '.join(METHODS)}")
    if lora is not None and method != "finetune":
        raise PosfairInputError(f"--adapter lora: only with --method finetune; got --method {method}")
    limits = limits or RepairLimits()
    out = Path(out_dir)
    work = out / "fit"
    if corpus is None:
        corpus = load_corpus()
    every_language, corpus = corpus, _english(corpus)
    stock = load_model(model_id, max_seq_length=max_seq_length)
    stock.set_calibration(STOCK)
    if lora is not None:  # refused before anything is written
        lora = dataclasses.replace(lora, targets=check_lora_targets(stock, lora.targets))
    work.mkdir(parents=True, exist_ok=True)
    recover(out)  # what a fit killed while it saved left: the previous model put back whole
    split = repair_split(stock, corpus, limit=max_seq_length, test_family=test_family, seed=seed)
    stock_units = [set_units(inst, _encoder(stock)) for inst in split.test]
    repaired = load_model(model_id, max_seq_length=max_seq_length)
    repaired.set_calibration(STOCK)
    t0 = time.perf_counter()
    fit_corpus = corpus[corpus[FAMILY_FIELD].astype(str) != split.test_family]
    repaired, fitted = _fit_method(method, repaired, split, fit_corpus, work, progress, steps, lora,
                                   _base_name(model_id))  # fmt: skip
    fit_seconds = time.perf_counter() - t0
    candidate = work / "candidate"
    if candidate.exists():
        shutil.rmtree(candidate)
    repaired.max_seq_length = _own_limit(model_id)
    repaired.save(str(candidate))
    folder_mib = _folder_mib(candidate)
    reloaded = load_model(str(candidate), max_seq_length=max_seq_length)
    heldout, ndcg, languages = _judge(stock, reloaded, stock_units, every_language, split, work)
    failures = check_repair(heldout, limits)
    ratio = _encode_ratio(stock, reloaded, [d.text for i in split.test for d in i.documents])
    saved = not failures or save_failing
    if saved:
        publish(candidate, out)
    else:
        shutil.rmtree(candidate)
    result = FitResult(
        method, str(model_id or "bundled"), split.test_family, split.counts(), fitted, heldout, ndcg, failures,
        saved, fit_seconds, ratio, str(out), limits, _peak_rss_mib(), split.fit_families,
        languages.translations_found, languages.multilingual, tuple(filter(None, [languages.note()])),
    )  # fmt: skip
    result.folder_mib = folder_mib
    if lora is not None:  # the table's method names the adapter: "finetune+lora r=16"
        result.method = f"{method}+{lora.label()}"
    atomic_write_text(work / "heldout.json", json.dumps(result.to_dict(), indent=2, default=float))
    atomic_write_text(work / "heldout.md", heldout_markdown([result]))
    repair_tradeoff([result], work / "tradeoff")
    return result


def _english(corpus: pd.DataFrame) -> pd.DataFrame:
    """The corpus's English sections: the fit's documents and the held-out table's (every language of the corpus
    enters the cross-language checks, :mod:`posfair.repair.queries`)."""
    if "lang" not in corpus.columns:
        return corpus
    english = corpus[corpus["lang"].astype(str) == "en"]
    if english.empty:
        langs = ", ".join(sorted(corpus["lang"].astype(str).unique()))
        raise PosfairInputError(f"--corpus: a repair is fitted on English sections ('en'); the corpus has {langs}")
    return english


def _judge(stock, reloaded, stock_units, corpus: pd.DataFrame, split: RepairSplit, work: Path):
    """The reloaded repair against stock on the held-out family: the held-out table (documents, then the title
    queries' nDCG@10 on the family's benchmark, title -> section and, for a multilingual model, the cross-language
    measures of :func:`~posfair.repair.queries.query_changes`: every measure :func:`check_repair` decides on),
    the nDCG dict, and the query checks.  ``corpus``: every language."""
    units = [set_units(inst, _encoder(reloaded)) for inst in split.test]
    heldout = evaluate_repair(
        np.concatenate(stock_units), np.concatenate(units), split.test[0].n, split.test_family,
        sum(len(i.documents) for i in split.test),
    )  # fmt: skip
    family = corpus[corpus[FAMILY_FIELD].astype(str) == split.test_family]
    ndcg = _ndcg(stock, reloaded, _english(family), split, work)
    languages = query_changes(stock, reloaded, family)
    title = () if not ndcg else (RetrievalChange(
        TITLE_NDCG, ndcg["stock"], ndcg["repaired"], ndcg["change"], ndcg["low"], ndcg["high"]),)  # fmt: skip
    heldout = dataclasses.replace(heldout, retrieval=(*heldout.retrieval, *title, *languages.changes))
    return heldout, ndcg, languages


def _peak_rss_mib() -> float:
    """This process's peak resident memory in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _base_name(model_id: str | None) -> str:
    """The base model as an adapter folder names it (:func:`posfair.load_model` loads it back): a bundled name or a
    hub id as given, a local folder by its absolute path."""
    if model_id is None:
        return "bundled"
    path = Path(model_id)
    return str(path.resolve()) if path.is_dir() else str(model_id)


def _folder_mib(folder: Path) -> float:
    """The size of the files under ``folder`` in MiB (the saved model, as the table reports it)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def _own_limit(model_id: str | None) -> int:
    """The model's own ``max_seq_length`` (the saved folder keeps it)."""
    return int(load_model(model_id).max_seq_length)


def _encoder(model) -> Callable[[list[str]], np.ndarray]:
    def encode(texts):
        return l2_normalize(encode_texts(model, texts, batch_size=16).astype(np.float64))

    return encode


#: the record, in the model folder, of which of its entries the model is made of (written by :func:`publish`)
RECORD = ".posfair-model.json"
#: entries of the model folder that are never the model's: posfair's own, and the fit's report folder
RESERVED = frozenset({SAVING_FOLDER, RECORD, "fit"})


def publish(candidate: str | os.PathLike, out: str | os.PathLike) -> None:
    """Make the model folder ``candidate`` the model of ``out``, whole or not at all (module docstring, "Saving
    whole"); ``candidate`` must be a folder on the same file system (it is renamed, and is gone afterwards)."""
    candidate, out = Path(candidate), Path(out)
    new_names = sorted(p.name for p in candidate.iterdir())
    reserved = RESERVED.intersection(new_names)
    if reserved:
        raise ValueError(f"{candidate}: a model folder may not hold {', '.join(sorted(reserved))}")
    recover(out)
    swap = out / SAVING_FOLDER
    new, old = swap / "new", swap / SAVING_OLD
    swap.mkdir()
    os.rename(candidate, new)
    _sync_tree(new)
    recorded = _recorded(out)
    old_names = sorted(n for n in {*(recorded or ()), *new_names} if os.path.lexists(out / n))
    old.mkdir()
    for name in old_names:
        _link_copy(out / name, old / name)
    _sync_tree(old)
    journal = {"old": old_names, "new": new_names, "record": recorded, "old_model": _is_model(old)}
    atomic_write_text(swap / SAVING_JOURNAL, json.dumps(journal))
    for name in new_names:
        _remove(out / name)
        os.replace(new / name, out / name)
    for name in sorted(set(old_names) - set(new_names)):
        _remove(out / name)
    _write_record(out, new_names)
    _sync_dir(out)
    os.unlink(swap / SAVING_JOURNAL)
    _sync_dir(swap)
    shutil.rmtree(swap)


def recover(out: str | os.PathLike) -> bool:
    """Undo what a killed :func:`publish` into ``out`` left (module docstring, "Saving whole"); True when there was
    something to undo or remove."""
    out = Path(out)
    swap = out / SAVING_FOLDER
    if not os.path.lexists(swap):
        return False
    journal = swap / SAVING_JOURNAL
    if journal.exists():
        record = json.loads(journal.read_text(encoding="utf-8"))
        old = swap / SAVING_OLD
        for name in sorted(set(record["new"]) | set(record["old"])):
            _remove(out / name)
            if name in record["old"]:
                _link_copy(old / name, out / name)
        _write_record(out, record["record"])
        _sync_dir(out)
        os.unlink(journal)
        log.warning("%s: a save killed half-way was undone (the previous model put back)", out)
    else:
        log.info("%s: removed %s, left by a save killed before it began", out, SAVING_FOLDER)
    shutil.rmtree(swap)
    return True


def _is_model(folder: Path) -> bool:
    """Whether ``folder`` holds a model (sentence-transformers', transformers' or an adapter's configuration)."""
    return any((folder / n).is_file() for n in ("modules.json", "config.json", "adapter_config.json"))


def _write_record(out: Path, entries: list[str] | None) -> None:
    """``out``'s record of its model's entries (None: no record), written in the save folder and renamed into place:
    a kill leaves no temporary file in ``out`` itself."""
    if entries is None:
        if os.path.lexists(out / RECORD):
            os.unlink(out / RECORD)
        return
    staged = atomic_write_text(out / SAVING_FOLDER / RECORD, json.dumps({"entries": entries}))
    os.replace(staged, out / RECORD)


def _recorded(out: Path) -> list[str] | None:
    """The entries of ``out`` that the previous save recorded as its model's (None: no record, or not one of
    posfair's; a name that is not one entry of ``out`` is never the model's)."""
    try:
        entries = json.loads((out / RECORD).read_text(encoding="utf-8"))["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(entries, list):
        return None
    return [n for n in entries if isinstance(n, str) and n not in RESERVED and n not in ("", ".", "..")
            and "/" not in n and os.sep not in n]  # fmt: skip


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _link(src: str, dst: str) -> None:
    """A hard link of ``src`` at ``dst``; a copy where the file system has none."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_copy(src: Path, dst: Path) -> None:
    """``src`` (a file, a link or a folder) at ``dst``, its files linked, not copied, where the file system allows."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, copy_function=_link)
    else:
        _link(str(src), str(dst))


def _sync_tree(folder: Path) -> None:
    """Flush ``folder``'s files and folders to disk (a power cut after the journal finds them whole)."""
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        _sync_dir(Path(root))


def _sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform that cannot open a folder (Windows): its renames are as durable as it makes them
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _encode_ratio(stock, repaired, texts: list[str]) -> float:
    """Encode time of the repaired model over stock's on the same texts, interleaved (best of 3 each)."""
    times = {0: [], 1: []}
    sample = texts[: min(len(texts), 48)]
    for _ in range(3):
        for k, m in ((0, stock), (1, repaired)):
            t = time.perf_counter()
            encode_texts(m, sample, batch_size=16)
            times[k].append(time.perf_counter() - t)
    return min(times[1]) / min(times[0])


def _ndcg(stock, repaired, corpus: pd.DataFrame, split: RepairSplit, work: Path) -> dict[str, float] | None:
    """nDCG@10 of stock and the repair on a benchmark built from the held-out family, with the change's interval."""
    part = corpus[corpus[FAMILY_FIELD].astype(str) == split.test_family]
    return heldout_ndcg(stock, repaired, part, work / "benchmark")


def heldout_markdown(results: list[FitResult]) -> str:
    """One table row per fit: per later position what happened to β_p (:func:`~posfair.repair.heldout.effect_words`:
    stock -> repaired, the share removed, or reversed), retrieval changes, the verdict."""
    rows = []
    for r in results:
        h = r.heldout
        row = {"method": r.method, "model": r.model, "held-out family": f"{h.family} ({h.sets} sets)"}
        for e in h.positions:
            row[f"β{e.position} [95 %]"] = _cell(effect_words(e))
        for c in h.retrieval:
            row[f"Δ{c.measure} pts [95 %]"] = f"{c.change:+.1f} [{c.change_low:+.1f}, {c.change_high:+.1f}]"
        row["fit s"] = f"{r.fit_seconds:.0f}"
        row["peak MiB"] = f"{r.peak_rss_mib:.0f}"
        row["folder MiB"] = f"{r.folder_mib:.1f}"
        row["encode / stock"] = f"{r.encode_ratio:.2f}x"
        row["verdict"] = "holds" if r.holds else _cell("fails: " + "; ".join(r.failures))
        rows.append(row)
    notes = [f"note ({r.method}, {r.model}): {n}" for r in results for n in r.notes]
    return pd.DataFrame(rows).to_markdown(index=False) + "\n" + "".join(f"\n{n}\n" for n in notes)


def _cell(text: str) -> str:
    """``text`` as one markdown table cell (its ``|``, as in ``|β2|``, escaped)."""
    return text.replace("|", "\\|")
