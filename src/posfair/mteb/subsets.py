"""One MTEB subset per positional group: the subsets of a benchmark and the numbers each subset's scores carry.

Each answer-position group of a benchmark becomes one ``hf_subset`` of the task's
single ``test`` split (:func:`_group_subsets`); for PosIR-style benchmarks without
groups, one subset per (length bucket, relative-position bin) with queries, plus one
per bucket for its queries without a relative position (:func:`_relpos_subsets`).
Why subsets and not splits, and how overlapping and empty groups are handled, is in
the package docs (:mod:`posfair.mteb`).  A group without queries has no subset: it is
left out with a :class:`MissingGroupWarning`.

Every subset's scores carry posfair's bookkeeping (queries scored, subsets declared,
bucket and bin) under the ``posfair_*`` keys below, so :mod:`posfair.mteb.scores`
needs only MTEB's results.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np

from posfair.retrieval.benchmarks import RetrievalBenchmark
from posfair.retrieval.groups import N_RELPOS_BINS, POSIR_BUCKETS, relpos_bin
from posfair.runtime.stacklevel import user_stacklevel

logger = logging.getLogger(__name__)

SPLIT = "test"
MAIN_SCORE = "ndcg_at_10"
# numbers every subset's scores carry (MTEB's task-specific scores), so position_scores needs only the results
_QUERIES = "posfair_queries"  # queries MTEB scored in the subset
_SUBSETS = "posfair_subsets"  # subsets the task declares
_BUCKET = "posfair_bucket"  # relpos subsets: 1-based index into POSIR_BUCKETS
_BIN = "posfair_bin"  # relpos subsets: relative-position bin, -1 for queries without one
_UNBINNED = "unbinned"


class MissingGroupWarning(UserWarning):
    """A positional group that has no queries, or that MTEB's results lack: its score is NaN, and
    Harm and PSI are over the other groups."""


@dataclass(frozen=True)
class _Subset:
    """One MTEB subset: a positional group (or a PosIR bucket's relative-position bin) and its queries."""

    name: str
    queries: tuple[int, ...]  # indices into the benchmark's queries
    bucket: int = 0  # relpos: 1-based index into POSIR_BUCKETS (0: a group)
    bin: int | None = None  # relpos: relative-position bin, -1 = none


def _group_subsets(b: RetrievalBenchmark) -> tuple[list[_Subset], list[str]]:
    subsets, labels = [], []
    for label, mask in b.groups.items():
        labels.append(label)
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            warnings.warn(
                f"benchmark {b.name!r}: group {label!r} has no queries; MTEB cannot score it, so the task has no subset "
                f"for it and position_scores reports it as NaN (Harm and PSI are over the other groups)",
                MissingGroupWarning,
                stacklevel=user_stacklevel(),
            )
            continue
        subsets.append(_Subset(name=label, queries=tuple(int(i) for i in idx)))
    return subsets, labels


def _relpos_subsets(b: RetrievalBenchmark) -> list[_Subset]:
    bucket = np.asarray([x if x is not None else "" for x in b.length_bucket], dtype=object)
    bins = relpos_bin(b.relpos)
    subsets = []
    for k, (label, _, _) in enumerate(POSIR_BUCKETS, start=1):
        in_bucket = bucket == label
        for j in [*range(N_RELPOS_BINS), -1]:
            idx = np.flatnonzero(in_bucket & (bins == j))
            if idx.size:
                name = f"{label}.bin{j:02d}" if j >= 0 else f"{label}.{_UNBINNED}"
                subsets.append(_Subset(name=name, queries=tuple(int(i) for i in idx), bucket=k, bin=j))
    outside = int((bucket == "").sum())
    if outside:
        logger.info("benchmark %s: %d queries are in no length bucket (no relative-position subset)", b.name, outside)
    return subsets
