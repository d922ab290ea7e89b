"""PosIR (``infgrad/PosIR-Benchmark-v1``) and any benchmark saved in its layout.

``<lang-Script>/<domain>/{queries.parquet, corpus.parquet, qrels/test.parquet}``;
retrieval is per domain (each domain has its own corpus), monolingual or
cross-lingual (queries + qrels of one language against the corpus of another).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.retrieval.benchmarks.benchmark import RetrievalBenchmark
from posfair.retrieval.benchmarks.sources import is_local, looks_like_hub_id
from posfair.retrieval.groups import posir_length_bucket, posir_relative_position

__all__ = ["POSIR_HUB_ID", "POSIR_LANGS", "POSIR_DIR", "posir_lang", "load_posir"]

POSIR_HUB_ID = "infgrad/PosIR-Benchmark-v1"
POSIR_LANGS = ("ara-Arab", "cmn-Hans", "deu-Latn", "eng-Latn", "fra-Latn", "ita-Latn", "kor-Kore", "por-Latn", "rus-Cyrl", "spa-Latn")
_ISO1_TO_POSIR = {
    "ar": "ara-Arab",
    "zh": "cmn-Hans",
    "de": "deu-Latn",
    "en": "eng-Latn",
    "fr": "fra-Latn",
    "it": "ita-Latn",
    "ko": "kor-Kore",
    "pt": "por-Latn",
    "ru": "rus-Cyrl",
    "es": "spa-Latn",
    "nl": "nld-Latn",
    "ja": "jpn-Jpan",
    "hi": "hin-Deva",
    "pl": "pol-Latn",
    "bn": "ben-Beng",
    "zh-cn": "cmn-Hans",
    "zh_cn": "cmn-Hans",
}
POSIR_DIR = re.compile(r"^[a-z]{3}-[A-Z][a-z]{3}$")


def posir_lang(lang: str) -> str:
    """PosIR directory name of a language: ``"en"`` -> ``"eng-Latn"``; PosIR names pass through."""
    if POSIR_DIR.match(lang):
        return lang
    try:
        return _ISO1_TO_POSIR[lang.lower()]
    except KeyError:
        raise ValueError(
            f"unknown language {lang!r}: give a PosIR directory name such as 'eng-Latn' or one of {sorted(_ISO1_TO_POSIR)}"
        ) from None


_POSIR_QUERY_COLS = ("_id", "text", "pos_char_span", "pos_char_length", "pos_token_length")


def _posir_root(source: Any, langs: Sequence[str]) -> Path:
    if is_local(source):
        root = Path(source).expanduser()
        if not root.is_dir():
            raise ValueError(f"{root}: a PosIR source must be a directory <root>/<lang-Script>/<domain>/...")
        return root
    if isinstance(source, str) and looks_like_hub_id(source):
        from huggingface_hub import snapshot_download  # only a hub download needs it

        return Path(snapshot_download(repo_id=source, repo_type="dataset", allow_patterns=[f"{lang}/**" for lang in langs]))
    raise FileNotFoundError(f"{source!r} is neither an existing local directory nor a hub dataset id")


def load_posir(
    source: Any = POSIR_HUB_ID, *, lang: str = "eng-Latn", corpus_lang: str | None = None, domains: Sequence[str] | None = None
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
    lang = posir_lang(lang)
    corpus_lang = posir_lang(corpus_lang) if corpus_lang else lang
    root = _posir_root(source, sorted({lang, corpus_lang}))
    qdir = root / lang
    if not qdir.is_dir():
        available = sorted(p.name for p in root.iterdir() if p.is_dir() and POSIR_DIR.match(p.name))
        raise ValueError(f"{root}: no language directory {lang!r}; available: {available}")
    domain_dirs = sorted(p for p in qdir.iterdir() if p.is_dir())
    if domains is not None:
        wanted = set(domains)
        unknown = wanted - {p.name for p in domain_dirs}
        if unknown:
            raise ValueError(f"{qdir}: unknown domain(s) {sorted(unknown)}")
        domain_dirs = [p for p in domain_dirs if p.name in wanted]
    frames_q, frames_c, qrels, skipped = [], [], {}, []
    for ddir in domain_dirs:
        qpath, rpath = ddir / "queries.parquet", ddir / "qrels" / "test.parquet"
        cpath = root / corpus_lang / ddir.name / "corpus.parquet"
        if not (qpath.exists() and rpath.exists() and cpath.exists()):
            skipped.append(ddir.name)
            continue
        q = pd.read_parquet(qpath)
        c = pd.read_parquet(cpath)
        r = pd.read_parquet(rpath)
        for df, cols, path in ((q, _POSIR_QUERY_COLS, qpath), (c, ("_id", "text"), cpath), (r, ("query-id", "corpus-id", "score"), rpath)):
            missing = [col for col in cols if col not in df.columns]
            if missing:
                raise ValueError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
        q = q.assign(_id=q["_id"].astype(str), domain=ddir.name)
        c = c.assign(_id=c["_id"].astype(str), domain=ddir.name)
        r = r[r["query-id"].astype(str).isin(set(q["_id"]))]
        for qid, did, score in zip(r["query-id"].astype(str), r["corpus-id"].astype(str), r["score"], strict=True):
            qrels.setdefault(f"{ddir.name}/{qid}", {})[did] = int(score)
        frames_q.append(q)
        frames_c.append(c)
    if skipped:
        warnings.warn(f"PosIR {lang}->{corpus_lang}: skipped domain(s) with missing files: {skipped}", stacklevel=2)
    if not frames_q:
        raise ValueError(
            f"{root}: no complete domain for {lang} -> {corpus_lang} (need queries.parquet, qrels/test.parquet and the corpus)"
        )
    q = pd.concat(frames_q, ignore_index=True)
    c = pd.concat(frames_c, ignore_index=True)
    relpos = np.array([posir_relative_position(s, n) for s, n in zip(q["pos_char_span"], q["pos_char_length"], strict=True)])
    buckets = [posir_length_bucket(float(t)) if pd.notna(t) else None for t in q["pos_token_length"]]
    groups: dict[str, np.ndarray] = {}
    if "segment_position" in q.columns:
        pos = q["segment_position"].to_numpy()
        groups = {f"seg {p}": pos == p for p in sorted(set(int(x) for x in pos))}
    name = f"posir[{lang}]" if corpus_lang == lang else f"posir[{lang}->{corpus_lang}]"
    meta_file = root / "benchmark.json"
    meta: dict[str, Any] = {"source": str(source), "lang": lang, "corpus_lang": corpus_lang}
    if meta_file.exists():
        built = json.loads(meta_file.read_text())
        meta["built"] = built
        name = (
            f"{built.get('name', root.name)}[{lang}]" if corpus_lang == lang else f"{built.get('name', root.name)}[{lang}->{corpus_lang}]"
        )
    return RetrievalBenchmark(
        name=name,
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
