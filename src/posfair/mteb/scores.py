"""posfair's positional metrics from MTEB's results: :func:`position_scores` and :class:`PositionScores`.

Reads what ``mteb.evaluate`` returns and gives, per posfair task, nDCG@10 per group
(MTEB's ``ndcg_at_10`` of the group's subset) and Harm and PSI computed with
:mod:`posfair.retrieval.metrics` (the evaluator's own definitions); for
``grouping="relpos"`` tasks, posfair's per-bucket nDCG@10 (query-weighted over the
bucket's subsets) and PSI over the relative-position bins.  A group or task missing
from the results is scored NaN with a :class:`MissingGroupWarning`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mteb.results import ModelResult, TaskResult

from posfair.mteb.subsets import _BIN, _BUCKET, _QUERIES, _SUBSETS, MAIN_SCORE, SPLIT, MissingGroupWarning
from posfair.mteb.task import PositionalRetrievalTask
from posfair.retrieval.groups import POSIR_BUCKETS
from posfair.retrieval.metrics import harmonic_mean, psi
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel


@dataclass
class PositionScores:
    """posfair's positional metrics of one task, computed from MTEB's per-subset scores.

    ``groups``: nDCG@10 per group (NaN for a group without queries or without a result);
    ``queries``: queries per group; ``harm`` / ``psi``: :func:`posfair.retrieval.metrics.harmonic_mean`
    and :func:`~posfair.retrieval.metrics.psi` of the groups.  For ``grouping="relpos"``,
    ``buckets`` maps each PosIR length bucket to ``{"n", "ndcg@10", "bins", "psi"}`` as
    :func:`~posfair.retrieval.metrics.posir_bucket_scores` does.
    """

    task: str
    grouping: str
    groups: dict[str, float] = field(default_factory=dict)
    queries: dict[str, int] = field(default_factory=dict)
    harm: float = math.nan
    psi: float = math.nan
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics under the names :class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` uses
        before its prefix (its keys with ``name=""``)."""
        out: dict[str, float] = {}
        for g, v in self.groups.items():
            out[f"ndcg@10[{g}]"] = v
        if self.groups:
            out["harm"] = self.harm
            out["psi"] = self.psi
        for b, v in self.buckets.items():
            out[f"psi[{b}]"] = v["psi"]
            out[f"ndcg@10[{b}]"] = v["ndcg@10"]
        return out


def _task_results(results: Any) -> tuple[list[TaskResult], dict[str, str]]:
    """The TaskResults in ``results`` and the error message of every task that failed."""
    errors: dict[str, str] = {}
    if isinstance(results, TaskResult):
        return [results], errors
    if isinstance(results, ModelResult):
        errors = {e.task_name: e.exception for e in results.exceptions or []}
        return list(results.task_results), errors
    if isinstance(results, Iterable) and not isinstance(results, (str, bytes, dict)):
        out: list[TaskResult] = []
        for r in results:
            found, errs = _task_results(r)
            out += found
            errors.update(errs)
        return out, errors
    raise PosfairInputError(
        f"results must be what mteb.evaluate returns (a ModelResult), a TaskResult or a list of them; got {type(results).__name__}"
    )


def _warn_missing(task: str, missing: list[str], present: int, declared: int, error: str | None) -> None:
    which = f": {', '.join(missing)}" if missing else " (pass tasks= to name them)"
    why = f"; MTEB reported: {error}" if error else ""
    warnings.warn(
        f"MTEB's results for task {task} have {present} of its {declared} subsets; missing{which} (scored NaN; "
        f"Harm and PSI are over the others){why}",
        MissingGroupWarning,
        stacklevel=user_stacklevel(),
    )


def _scores_of(
    name: str, entries: list[dict[str, Any]], task: PositionalRetrievalTask | None, error: str | None
) -> PositionScores:
    by_subset = {e["hf_subset"]: e for e in entries}
    declared = int(entries[0][_SUBSETS])
    missing = [s for s in task.subsets if s not in by_subset] if task is not None else []
    if missing or len(by_subset) < declared:
        _warn_missing(name, missing, len(by_subset), declared, error)
    if task is not None:
        short = [
            f"{s} ({int(e[_QUERIES])} of {len(task.subsets[s].queries)})"
            for s, e in by_subset.items()
            if s in task.subsets and int(e[_QUERIES]) != len(task.subsets[s].queries)
        ]
        if short:
            warnings.warn(
                f"MTEB scored fewer queries than task {name} holds in: {', '.join(short)}; those groups' scores are over the scored ones",
                MissingGroupWarning,
                stacklevel=user_stacklevel(),
            )
    relpos = task.grouping == "relpos" if task is not None else any(_BIN in e for e in entries)
    if not relpos:
        order = list(task.group_labels) if task is not None else list(by_subset)
        groups = {g: float(by_subset[g][MAIN_SCORE]) if g in by_subset else math.nan for g in order}
        queries = {g: int(by_subset[g][_QUERIES]) if g in by_subset else 0 for g in order}
        return PositionScores(name, "groups", groups, queries, harmonic_mean(groups), psi(groups))
    buckets: dict[str, dict[str, Any]] = {}
    for k, (label, _, _) in enumerate(POSIR_BUCKETS, start=1):
        mine = [e for e in entries if int(e.get(_BUCKET, 0)) == k]
        if not mine:
            continue
        n = np.array([e[_QUERIES] for e in mine], dtype=np.float64)
        ndcg = np.array([e[MAIN_SCORE] for e in mine], dtype=np.float64)
        bins = {int(e[_BIN]): float(e[MAIN_SCORE]) for e in sorted(mine, key=lambda e: e[_BIN]) if int(e[_BIN]) >= 0}
        buckets[label] = {
            "n": int(n.sum()),
            "ndcg@10": float((n * ndcg).sum() / n.sum()),
            "bins": bins,
            "psi": psi(bins),
        }
    return PositionScores(name, "relpos", buckets=buckets)


def position_scores(results: Any, tasks: Sequence[PositionalRetrievalTask] | None = None) -> dict[str, PositionScores]:
    """posfair's positional metrics from what ``mteb.evaluate`` returns, per posfair task.

    Args:
        results: a ``mteb`` ModelResult (what ``mteb.evaluate`` returns), a TaskResult, or a
            list of them; results of other MTEB tasks are ignored.
        tasks: the tasks :func:`tasks` returned.  With them, only those tasks are read, a task
            or group missing from the results is named in a :class:`MissingGroupWarning`, and
            groups keep the benchmark's order (groups without queries included, as NaN).
            Without them, the groups are the subsets found, and a shortfall is still warned.

    Returns:
        task name -> :class:`PositionScores`: nDCG@10 per group (MTEB's ``ndcg_at_10`` of
        the group's subset, i.e. the mean over its queries, as posfair's group score), Harm
        and PSI computed with :mod:`posfair.retrieval.metrics`; per-bucket scores for
        relative-position tasks.

    Raises:
        PosfairInputError: ``results`` is not MTEB results, holds no posfair task, or
            ``tasks`` holds something other than posfair tasks.
    """
    found, errors = _task_results(results)
    wanted: dict[str, PositionalRetrievalTask] = {}
    for t in tasks or ():
        if not isinstance(t, PositionalRetrievalTask):
            raise PosfairInputError(f"tasks must be what posfair.mteb.tasks() returned; got {type(t).__name__}")
        wanted[t.metadata.name] = t
    out: dict[str, PositionScores] = {}
    for tr in found:
        if wanted and tr.task_name not in wanted:
            continue
        entries = [e for e in tr.scores.get(SPLIT, []) if _QUERIES in e]
        if entries:
            out[tr.task_name] = _scores_of(tr.task_name, entries, wanted.get(tr.task_name), errors.get(tr.task_name))
    for name in wanted:
        if name not in out:
            why = f" (MTEB reported: {errors[name]})" if name in errors else ""
            warnings.warn(f"MTEB's results lack task {name}{why}", MissingGroupWarning, stacklevel=user_stacklevel())
    if not out:
        names = sorted({tr.task_name for tr in found} | set(errors))
        raise PosfairInputError(f"no result of a posfair task among MTEB's results (tasks: {names or 'none'})")
    return out
