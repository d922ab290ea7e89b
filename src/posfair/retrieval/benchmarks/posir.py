"""PosIR (``infgrad/PosIR-Benchmark-v1``) and any benchmark saved in its layout, as a retrieval benchmark.

``<lang-Script>/<domain>/{queries.parquet, corpus.parquet, qrels/test.parquet}``;
retrieval is per domain (each domain has its own corpus), monolingual or
cross-lingual (queries + qrels of one language against the corpus of another).
The layout itself is read by :func:`posfair.corpus.posir_layout.read_posir` (shared with
``posfair embed``); this module adds PosIR's position columns: relative answer
position, length bucket and per-segment groups.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posfair.corpus.posir_layout import (
    POSIR_DIR,
    POSIR_HUB_ID,
    POSIR_LANGS,
    describe_number,
    is_score,
    posir_lang,
    read_posir,
)
from posfair.retrieval.benchmarks.benchmark import RetrievalBenchmark
from posfair.retrieval.groups import posir_length_bucket, posir_relative_position

__all__ = ["POSIR_HUB_ID", "POSIR_LANGS", "POSIR_DIR", "posir_lang", "load_posir"]

# the position columns retrieval needs beyond the layout's own
_POSITION_COLUMNS = ("pos_char_span", "pos_char_length", "pos_token_length")


def load_posir(
    source: Any = POSIR_HUB_ID,
    *,
    lang: str = "eng-Latn",
    corpus_lang: str | None = None,
    domains: Sequence[str] | None = None,
) -> RetrievalBenchmark:
    """PosIR (or any benchmark saved in its layout, e.g. by :func:`build_from_corpus`).

    Monolingual when ``corpus_lang`` is None or equal to ``lang``; cross-lingual
    (xx -> yy) otherwise: queries and qrels of ``lang`` against ``corpus_lang``'s
    corpus of the same domain (document ids are shared across languages).  As in
    the reference scripts, a domain missing any of its three files is skipped
    with a warning, and qrels are restricted to the listed queries.  Query
    columns beyond the published ones: ``segment_position`` (1-based) gives
    per-segment groups ``"seg 1"``, ``"seg 2"``, ...; ``n_segments`` the
    segments of the query's document.

    Checked when read (ValueError naming the file, the row, 0-based, and the column):
    qrels scores are finite numbers (graded: nDCG's gain is the score; see
    :class:`RetrievalBenchmark`); ``segment_position`` is an integer in
    1..``n_segments`` (1..``k`` of ``benchmark.json`` without that column) and
    ``n_segments`` a positive integer; PosIR's position columns hold numbers
    (``pos_char_span`` a list, a pair of numbers for a defined position) or nulls (an
    undefined position, as in the reference scripts).
    """
    tables = read_posir(source, lang=lang, corpus_lang=corpus_lang, domains=domains)
    q, c, r = tables.queries, tables.corpus, tables.qrels
    for domain, rows in q.groupby("domain", sort=True):  # name the file, as read_posir does for the layout's columns
        missing = [col for col in _POSITION_COLUMNS if col not in rows.columns or rows[col].isna().all()]
        if missing:
            path = tables.root / tables.lang / str(domain) / "queries.parquet"
            raise ValueError(
                f"{path}: missing column(s) {missing} (PosIR's answer positions); found {list(rows.columns.drop('domain'))}"
            )
        k = (tables.built or {}).get("k")
        _check_positions(rows, tables.root / tables.lang / str(domain) / "queries.parquet", k)
    qrels: dict[str, dict[str, float]] = {}
    for dom, qid, did, score in zip(
        r["domain"], r["query-id"].astype(str), r["corpus-id"].astype(str), r["score"], strict=True
    ):
        qrels.setdefault(f"{dom}/{qid}", {})[did] = _score(score)
    relpos = np.array(
        [posir_relative_position(s, n) for s, n in zip(q["pos_char_span"], q["pos_char_length"], strict=True)]
    )
    buckets = [posir_length_bucket(float(t)) if pd.notna(t) else None for t in q["pos_token_length"]]
    groups: dict[str, np.ndarray] = {}
    if "segment_position" in q.columns:
        pos = q["segment_position"].to_numpy()
        groups = {f"seg {p}": pos == p for p in sorted(set(int(x) for x in pos))}
    meta: dict[str, Any] = {"source": str(source), "lang": tables.lang, "corpus_lang": tables.corpus_lang}
    if tables.built is not None:
        meta["built"] = tables.built
    return RetrievalBenchmark(
        name=tables.name,
        corpus_ids=c["_id"].tolist(),
        corpus_texts=c["text"].tolist(),
        query_ids=[f"{d}/{i}" for d, i in zip(q["domain"], q["_id"], strict=True)],
        query_texts=q["text"].tolist(),
        qrels=qrels,
        groups=groups,
        length_bucket=buckets,
        relpos=relpos,
        query_domains=q["domain"].tolist(),
        corpus_domains=c["domain"].tolist(),
        meta=meta,
    )


def _score(value: Any) -> float:
    """A qrels score (finite: checked by read_posir) as a number: an integer stays one (1.0 -> 1)."""
    value = float(value)
    return int(value) if value.is_integer() else value


def _integer(value: Any) -> bool:
    return is_score(value) and float(value).is_integer()


def _check_positions(rows: pd.DataFrame, path: Any, k: Any) -> None:
    """ValueError naming ``path``, the row (0-based: ``rows`` holds one file's queries in file order) and the column
    of the first position value retrieval cannot use (see :func:`load_posir`)."""

    def refuse(i: int, column: str, value: Any, rule: str) -> ValueError:
        return ValueError(f"{path}: row {i}: {column!r} is {describe_number(value)}: {rule}")

    for column in ("pos_char_length", "pos_token_length"):
        for i, v in enumerate(rows[column].tolist()):
            if not (_missing(v) or (isinstance(v, numbers.Real) and not isinstance(v, bool))):
                raise refuse(i, column, v, "must be a number (or null for an undefined position)")
    for i, span in enumerate(rows["pos_char_span"].tolist()):
        if _missing(span):
            continue
        # a list of another length is an undefined position (NaN), as in the reference scripts
        pair = list(span) if isinstance(span, (list, tuple, np.ndarray)) else None
        if pair is None or (
            len(pair) == 2 and not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in pair)
        ):
            shown = repr(pair if pair is not None else span)
            raise ValueError(
                f"{path}: row {i}: 'pos_char_span' is {shown[:60]}: must be a pair of numbers [start, end] (or null)"
            )
    has_n = "n_segments" in rows.columns
    if has_n:
        for i, v in enumerate(rows["n_segments"].tolist()):
            if not _integer(v) or v < 1:
                raise refuse(i, "n_segments", v, "must be a positive integer (the segments of the query's document)")
    if "segment_position" not in rows.columns:
        return
    counts = rows["n_segments"].tolist() if has_n else None
    for i, v in enumerate(rows["segment_position"].tolist()):
        top = int(counts[i]) if counts is not None else (int(k) if _integer(k) and k >= 1 else None)
        if not _integer(v) or v < 1 or (top is not None and v > top):
            within = (
                f"1..{top} (n_segments of the row)"
                if counts is not None
                else (f"1..{top} (k of benchmark.json)" if top is not None else ">= 1")
            )
            raise refuse(i, "segment_position", v, f"a segment position must be an integer in {within}")


def _missing(value: Any) -> bool:
    """A null cell (None, NaN, pandas' NA)."""
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float) and np.isnan(value)
