"""The benchmark object every loader returns: queries, a corpus, graded qrels and positional metadata."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from posfair.corpus.posir_layout import is_score

__all__ = ["RetrievalBenchmark"]


#: below this many queries in a positional group (or documents), a benchmark is too small to separate methods
MIN_QUERIES_PER_GROUP = 30


def resolution_points(queries: int) -> float:
    """Half-width, in nDCG@10 points (x100), of a 95 % interval of a mean over ``queries`` per-query scores in
    [0, 1], at the largest spread such a score can have (standard deviation 0.5): a worst-case bound on how
    finely a group's nDCG@10 is resolved."""
    return float("inf") if queries <= 0 else 100 * 1.96 * 0.5 / np.sqrt(queries)


class BenchmarkSizeWarning(UserWarning):
    """A benchmark too small to separate methods (few documents or few queries in a positional group)."""


@dataclass(frozen=True)
class BenchmarkSize:
    """The size of a benchmark and what it can resolve: one rule for ``build-benchmark``, ``retrieval``,
    ``sweep`` and ``tune`` (:meth:`RetrievalBenchmark.size`)."""

    name: str
    documents: int
    queries: int
    per_group: dict[str, int]

    @property
    def smallest(self) -> int:
        """Queries in the smallest positional group (all queries when there are no groups)."""
        return min(self.per_group.values()) if self.per_group else self.queries

    @property
    def too_small(self) -> bool:
        return self.documents < MIN_QUERIES_PER_GROUP or self.smallest < MIN_QUERIES_PER_GROUP

    def line(self) -> str:
        groups = "" if not self.per_group else f" ({', '.join(f'{g}: {n}' for g, n in self.per_group.items())})"
        return (
            f"benchmark {self.name}: {self.documents} documents, {self.queries} queries{groups}; "
            f"a group's nDCG@10 is resolved to about ±{resolution_points(self.smallest):.0f} points (95 %, worst case)"
        )

    def warning(self, advice: str = "") -> str | None:
        """The warning for a benchmark too small to separate methods (None when it is not)."""
        if not self.too_small:
            return None
        what = "documents" if self.documents < MIN_QUERIES_PER_GROUP else "queries in its smallest positional group"
        count = self.documents if self.documents < MIN_QUERIES_PER_GROUP else self.smallest
        return (
            f"benchmark {self.name} is too small to separate methods: {count} {what} (fewer than {MIN_QUERIES_PER_GROUP}); "
            f"differences below about ±{resolution_points(self.smallest):.0f} nDCG@10 points are noise"
            + (f"; {advice}" if advice else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "queries": self.queries,
            "queries_per_group": dict(self.per_group),
            "resolution_points": round(resolution_points(self.smallest), 2),
            "too_small": self.too_small,
        }


@dataclass
class RetrievalBenchmark:
    """Queries, a corpus, graded qrels and the positional metadata of each query.

    A qrels score is any finite number (NaN and infinities are refused).  A document
    is relevant to a query when its score is > 0 (``relevant``: recall, the tuner's
    units); nDCG uses the score itself as the gain (``gains``, aligned with
    ``relevant``), as trec_eval / pytrec_eval / ir-measures compute nDCG; a score
    <= 0 is not relevant and gains nothing (trec_eval's rule).

    ``groups`` maps a group's name to a boolean mask over the queries (groups may
    overlap, as published).  ``length_bucket`` / ``relpos`` (PosIR-style) give
    each query's length bucket (``"Q1"``..``"Q4"`` or None) and relative position
    (NaN when undefined).  When ``query_domains`` / ``corpus_domains`` are set,
    a query is searched only against the documents of its own domain, and its
    qrels refer to document ids of that domain.
    """

    name: str
    corpus_ids: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, float]]
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    length_bucket: list[str | None] | None = None
    relpos: np.ndarray | None = None
    query_domains: list[str] | None = None
    corpus_domains: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        nq, nd = len(self.query_ids), len(self.corpus_ids)
        if nd == 0:
            raise ValueError(f"benchmark {self.name!r} has an empty corpus")
        if nq == 0:
            raise ValueError(f"benchmark {self.name!r} has no queries")
        if len(self.corpus_texts) != nd or len(self.query_texts) != nq:
            raise ValueError(f"benchmark {self.name!r}: ids and texts differ in length")
        if (self.query_domains is None) != (self.corpus_domains is None):
            raise ValueError("query_domains and corpus_domains must be given together")
        qdom = self.query_domains or [""] * nq
        cdom = self.corpus_domains or [""] * nd
        if len(qdom) != nq or len(cdom) != nd:
            raise ValueError(f"benchmark {self.name!r}: domain lists do not match the queries / corpus")
        self._doc_index: dict[tuple[str, str], int] = {}
        for i, (d, did) in enumerate(zip(cdom, self.corpus_ids, strict=True)):
            if (d, did) in self._doc_index:
                raise ValueError(
                    f"benchmark {self.name!r}: duplicate document id {did!r}" + (f" in domain {d!r}" if d else "")
                )
            self._doc_index[(d, did)] = i
        rel: list[np.ndarray] = []
        gains: list[np.ndarray] = []
        for qid, d in zip(self.query_ids, qdom, strict=True):
            judged = self.qrels.get(qid)
            if not judged:
                raise ValueError(f"benchmark {self.name!r}: query {qid!r} has no qrels")
            positive = []
            for did, score in judged.items():
                if (d, did) not in self._doc_index:
                    raise ValueError(f"benchmark {self.name!r}: qrels of query {qid!r} name unknown document {did!r}")
                if not is_score(score):
                    raise ValueError(
                        f"benchmark {self.name!r}: qrels of query {qid!r}, document {did!r}: score {score!r} "
                        "is not a finite number"
                    )
                if score > 0:
                    positive.append((self._doc_index[(d, did)], float(score)))
            if not positive:
                raise ValueError(f"benchmark {self.name!r}: query {qid!r} has no relevant document (score > 0)")
            positive.sort()
            rel.append(np.asarray([i for i, _ in positive], dtype=np.int64))
            gains.append(np.asarray([g for _, g in positive], dtype=np.float64))
        #: per query, the indices of its relevant documents (score > 0), ascending
        self.relevant = rel
        #: per query, the gain (qrels score) of each document of ``relevant``, in the same order
        self.gains = gains
        for group, mask in list(self.groups.items()):
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (nq,):
                raise ValueError(f"group {group!r}: mask has shape {mask.shape}, expected ({nq},)")
            self.groups[group] = mask
        if self.length_bucket is not None and len(self.length_bucket) != nq:
            raise ValueError("length_bucket must have one entry per query")
        if self.relpos is not None:
            self.relpos = np.asarray(self.relpos, dtype=float)
            if self.relpos.shape != (nq,):
                raise ValueError("relpos must have one entry per query")

    @property
    def is_posir(self) -> bool:
        return self.length_bucket is not None and self.relpos is not None

    def domain_slices(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """``(domain, query indices, document indices)`` for each domain (one '' domain if none)."""
        if self.query_domains is None:
            return [("", np.arange(len(self.query_ids)), np.arange(len(self.corpus_ids)))]
        q = np.asarray(self.query_domains, dtype=object)
        c = np.asarray(self.corpus_domains, dtype=object)
        return [(d, np.flatnonzero(q == d), np.flatnonzero(c == d)) for d in dict.fromkeys(self.query_domains)]

    def size(self) -> BenchmarkSize:
        """How many documents and queries (per positional group) the benchmark holds, and what that resolves."""
        per_group = {g: int(m.sum()) for g, m in self.groups.items()}
        return BenchmarkSize(self.name, len(self.corpus_ids), len(self.query_ids), per_group)

    def fingerprint(self) -> str:
        """A SHA-256 (20 hex digits) of everything a result on this benchmark is computed from: the documents,
        queries, qrels (with their scores), positional groups, length buckets, relative positions and domains --
        not its name, nor the path it was read from.  Results on it are keyed by this (``posfair retrieval``,
        ``sweep``, ``tune``)."""
        h = hashlib.sha256()

        def put(obj: Any) -> None:
            h.update(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
            h.update(b"\x00")

        put(["corpus", self.corpus_ids, self.corpus_texts, self.corpus_domains])
        put(["queries", self.query_ids, self.query_texts, self.query_domains])
        put(["qrels", {q: {d: float(s) for d, s in judged.items()} for q, judged in self.qrels.items()}])
        put(["groups", {g: np.flatnonzero(m).tolist() for g, m in self.groups.items()}])
        put(["length_bucket", self.length_bucket])
        put(["relpos", None if self.relpos is None else [None if np.isnan(x) else float(x) for x in self.relpos]])
        return h.hexdigest()[:20]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "queries": len(self.query_ids), "documents": len(self.corpus_ids)}
        out["groups"] = {k: int(v.sum()) for k, v in self.groups.items()}
        if self.length_bucket is not None:
            out["length_buckets"] = dict(sorted(pd.Series([b for b in self.length_bucket if b]).value_counts().items()))
        if self.query_domains is not None:
            out["domains"] = len(set(self.query_domains))
        return out
