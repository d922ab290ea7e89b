"""PosIR (``infgrad/PosIR-Benchmark-v1``) and any benchmark saved in its layout, as a retrieval benchmark.

``<lang-Script>/<domain>/{queries.parquet, corpus.parquet, qrels/test.parquet}``;
retrieval is per domain (each domain has its own corpus), monolingual or
cross-lingual (queries + qrels of one language against the corpus of another).
The layout itself is read by :func:`posfair.corpus.posir_layout.read_posir` (shared with
``posfair embed``); this module adds PosIR's position columns: relative answer
position, length bucket and per-segment groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posfair.corpus.posir_layout import POSIR_DIR, POSIR_HUB_ID, POSIR_LANGS, posir_lang, read_posir
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
    per-segment groups ``"seg 1"``, ``"seg 2"``, ...
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
    qrels: dict[str, dict[str, int]] = {}
    for dom, qid, did, score in zip(
        r["domain"], r["query-id"].astype(str), r["corpus-id"].astype(str), r["score"], strict=True
    ):
        qrels.setdefault(f"{dom}/{qid}", {})[did] = int(score)
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
