"""SQuAD-PosQ and FineWeb-PosQ (definitions in ``docs/definitions.md``, section 4,
reproducing the reference code of Zeng et al. 2025).

* :func:`load_squad_posq` - SQuAD v2 (hub ``rajpurkar/squad_v2``), train +
  validation; answerable questions are the queries, every context (exact-string
  deduplicated, sorted) is the corpus; groups by first answer start.
* :func:`load_fineweb_posq` - ``NovaSearch/FineWeb-PosQ`` split train; groups
  by ``span_class``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from posfair.retrieval.benchmarks.benchmark import RetrievalBenchmark
from posfair.retrieval.benchmarks.sources import check_fields, read_splits, source_name
from posfair.retrieval.groups import fineweb_group_masks, squad_group_masks

__all__ = ["SQUAD_HUB_ID", "FINEWEB_HUB_ID", "load_squad_posq", "load_fineweb_posq"]

SQUAD_HUB_ID = "rajpurkar/squad_v2"
FINEWEB_HUB_ID = "NovaSearch/FineWeb-PosQ"


def _posq_benchmark(
    name: str,
    passages: list[str],
    qids: list[str],
    questions: list[str],
    q2p: dict[str, str],
    groups: dict[str, np.ndarray],
    meta: dict,
) -> RetrievalBenchmark:
    """The PosQ construction: corpus = ``sorted(set(passages))`` (exact-string dedup, ids = rank
    in that order, as the reference's ``passage2id``); one positive per query, ``q2p[question]``."""
    corpus = sorted(set(passages))
    p2i = {p: i for i, p in enumerate(corpus)}
    corpus_ids = [str(i) for i in range(len(corpus))]
    return RetrievalBenchmark(
        name=name,
        corpus_ids=corpus_ids,
        corpus_texts=corpus,
        query_ids=qids,
        query_texts=questions,
        qrels={qid: {corpus_ids[p2i[q2p[q]]]: 1} for qid, q in zip(qids, questions, strict=True)},
        groups=groups,
        meta=meta,
    )


def load_squad_posq(
    source: Any = SQUAD_HUB_ID, *, sample: int | None = None, seed: int = 42, convention: str = "inclusive"
) -> RetrievalBenchmark:
    """SQuAD-PosQ.

    Reproduces the reference: train + validation rows in order; a row with an
    answer contributes the query ``(question, answers.answer_start[0])``; every
    context is in the corpus.  The positive of a question is the context of the
    *last* row with that exact question text (the reference keys its
    question -> context map by the question string).  ``sample=10000`` gives the
    "tiny" variant (``random.seed(42); random.shuffle(queries)``, first 10,000;
    full corpus).  Groups: see :mod:`posfair.retrieval.groups` (``convention``).
    """
    rows = read_splits(source, ("train", "validation"))
    check_fields(rows, ("question", "context", "answers"), "SQuAD-PosQ")
    queries, passages, q2p = [], [], {}
    for i, row in enumerate(rows):
        answers = row["answers"]
        if not isinstance(answers, Mapping) or "answer_start" not in answers:
            raise ValueError(f"SQuAD-PosQ row {i}: 'answers' must be a mapping with 'text' and 'answer_start'")
        starts = list(answers["answer_start"])
        passages.append(row["context"])
        if starts:
            qid = str(row.get("id", i))
            queries.append((qid, row["question"], int(starts[0])))
            q2p[row["question"]] = row["context"]
    if not queries:
        raise ValueError("SQuAD-PosQ: no answerable question in the data")
    if sample is not None:
        random.Random(seed).shuffle(queries)
        queries = queries[:sample]
    return _posq_benchmark(
        "squad-posq" if sample is None else f"squad-posq-{sample}",
        passages,
        _unique_ids([q[0] for q in queries]),
        [q[1] for q in queries],
        q2p,
        squad_group_masks([q[2] for q in queries], convention=convention),
        {"source": source_name(source), "convention": convention, "sample": sample},
    )


def _unique_ids(ids: list[str]) -> list[str]:
    """Make ids unique by suffixing repeats (``x``, ``x#2``, ...), keeping the first as is."""
    seen: dict[str, int] = {}
    out = []
    for i in ids:
        n = seen.get(i, 0) + 1
        seen[i] = n
        out.append(i if n == 1 else f"{i}#{n}")
    return out


def load_fineweb_posq(
    source: Any = FINEWEB_HUB_ID, *, sample_per_group: int | None = None, seed: int = 42
) -> RetrievalBenchmark:
    """FineWeb-PosQ.

    Reproduces the reference: rows with a question are queries (positive = the
    content of the last row with that question text); every row's content is in
    the corpus (deduplicated, sorted).  ``sample_per_group=1000`` is the
    reference's sampled variant (shuffle with seed 42, first 1,000 queries of
    each group, duplicates of a question text dropped).
    """
    rows = read_splits(source, ("train",))
    check_fields(rows, ("question", "content", "span_class"), "FineWeb-PosQ")
    queries, passages, q2p = [], [], {}
    for row in rows:
        if row.get("question"):
            queries.append((row["question"], list(row["span_class"] or [])))
            q2p[row["question"]] = row["content"]
        passages.append(row["content"])
    if not queries:
        raise ValueError("FineWeb-PosQ: no row has a question")
    if sample_per_group is not None:
        random.Random(seed).shuffle(queries)
        picked = [
            q for c in ("beginning", "middle", "end") for q in [q for q in queries if c in q[1]][:sample_per_group]
        ]
        seen, queries = set(), []
        for q in picked:
            if q[0] not in seen:
                seen.add(q[0])
                queries.append(q)
    return _posq_benchmark(
        "fineweb-posq" if sample_per_group is None else f"fineweb-posq-{sample_per_group}pg",
        passages,
        [str(i) for i in range(len(queries))],
        [q[0] for q in queries],
        q2p,
        fineweb_group_masks([q[1] for q in queries]),
        {"source": source_name(source), "sample_per_group": sample_per_group},
    )
