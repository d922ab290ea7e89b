"""Position-aware retrieval benchmarks: the published ones and one built offline.

Published benchmarks (definitions in ``shared/specs/retrieval-benchmarks.md``,
reproducing the reference code of Zeng et al. 2025 / PosIR):

* :func:`load_squad_posq` - SQuAD v2 (hub ``rajpurkar/squad_v2``), train +
  validation; answerable questions are the queries, every context (exact-string
  deduplicated, sorted) is the corpus; groups by first answer start.
* :func:`load_fineweb_posq` - ``NovaSearch/FineWeb-PosQ`` split train; groups
  by ``span_class``.
* :func:`load_posir` - ``infgrad/PosIR-Benchmark-v1``:
  ``<lang-Script>/<domain>/{queries.parquet, corpus.parquet, qrels/test.parquet}``;
  retrieval is per domain (each domain has its own corpus), monolingual or
  cross-lingual (queries + qrels of one language against the corpus of another).

Each loader takes a hub id (the normal path, needs the hub) or a local copy in
the published layout: a directory saved with ``datasets.save_to_disk``, a
directory of data files as on the hub, a single parquet / json(l) file, or (for
PosIR) the downloaded directory tree.

:func:`build_from_corpus` builds a benchmark from any aligned corpus and saves it
in PosIR's layout (:func:`load_posir` reads it back, with extra per-segment
position groups).
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.io import atomic_write_json, atomic_write_parquet
from posfair.retrieval.groups import (
    fineweb_group_masks,
    posir_length_bucket,
    posir_relative_position,
    squad_group_masks,
)

__all__ = [
    "RetrievalBenchmark",
    "SQUAD_HUB_ID",
    "FINEWEB_HUB_ID",
    "POSIR_HUB_ID",
    "POSIR_LANGS",
    "load_squad_posq",
    "load_fineweb_posq",
    "load_posir",
    "load_benchmark",
    "build_from_corpus",
    "posir_lang",
]

SQUAD_HUB_ID = "rajpurkar/squad_v2"
FINEWEB_HUB_ID = "NovaSearch/FineWeb-PosQ"
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
_POSIR_DIR = re.compile(r"^[a-z]{3}-[A-Z][a-z]{3}$")


def posir_lang(lang: str) -> str:
    """PosIR directory name of a language: ``"en"`` -> ``"eng-Latn"``; PosIR names pass through."""
    if _POSIR_DIR.match(lang):
        return lang
    try:
        return _ISO1_TO_POSIR[lang.lower()]
    except KeyError:
        raise ValueError(
            f"unknown language {lang!r}: give a PosIR directory name such as 'eng-Latn' or one of {sorted(_ISO1_TO_POSIR)}"
        ) from None


@dataclass
class RetrievalBenchmark:
    """Queries, a corpus, binary qrels and the positional metadata of each query.

    ``groups`` maps a group label to a boolean mask over the queries (groups may
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
    qrels: dict[str, dict[str, int]]
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
        for i, (d, did) in enumerate(zip(cdom, self.corpus_ids)):
            if (d, did) in self._doc_index:
                raise ValueError(f"benchmark {self.name!r}: duplicate document id {did!r}" + (f" in domain {d!r}" if d else ""))
            self._doc_index[(d, did)] = i
        rel: list[np.ndarray] = []
        for qid, d in zip(self.query_ids, qdom):
            judged = self.qrels.get(qid)
            if not judged:
                raise ValueError(f"benchmark {self.name!r}: query {qid!r} has no qrels")
            idx = []
            for did, score in judged.items():
                if (d, did) not in self._doc_index:
                    raise ValueError(f"benchmark {self.name!r}: qrels of query {qid!r} name unknown document {did!r}")
                if score > 0:
                    idx.append(self._doc_index[(d, did)])
            if not idx:
                raise ValueError(f"benchmark {self.name!r}: query {qid!r} has no relevant document (score > 0)")
            rel.append(np.asarray(sorted(idx), dtype=np.int64))
        self.relevant = rel
        for label, mask in list(self.groups.items()):
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (nq,):
                raise ValueError(f"group {label!r}: mask has shape {mask.shape}, expected ({nq},)")
            self.groups[label] = mask
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

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "queries": len(self.query_ids), "documents": len(self.corpus_ids)}
        out["groups"] = {k: int(v.sum()) for k, v in self.groups.items()}
        if self.length_bucket is not None:
            out["length_buckets"] = dict(sorted(pd.Series([b for b in self.length_bucket if b]).value_counts().items()))
        if self.query_domains is not None:
            out["domains"] = len(set(self.query_domains))
        return out


# --------------------------------------------------------------------------------------
# reading the published layouts


def _is_local(source: Any) -> bool:
    return isinstance(source, Path) or (isinstance(source, str) and Path(source).expanduser().exists())


def _looks_like_hub_id(source: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", source))


def _read_splits(source: Any, splits: Sequence[str]) -> list[dict]:
    """Rows of ``splits`` (those present, in order) from a hub id, a local copy or in-memory data."""
    import datasets

    if isinstance(source, datasets.DatasetDict):
        present = [s for s in splits if s in source]
        if not present:
            raise ValueError(f"the dataset has splits {list(source)}, none of {list(splits)}")
        return [row for s in present for row in source[s].to_list()]
    if isinstance(source, datasets.Dataset):
        return source.to_list()
    if isinstance(source, pd.DataFrame):
        return source.to_dict("records")
    if isinstance(source, list):
        return list(source)
    if _is_local(source):
        path = Path(source).expanduser()
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return _read_splits(datasets.load_from_disk(str(path)), splits)
        if path.is_file():
            suffix = path.suffix.lower()
            if suffix == ".parquet":
                return pd.read_parquet(path).to_dict("records")
            if suffix in (".jsonl", ".json"):
                return _read_splits(datasets.load_dataset("json", data_files=str(path), split="train"), splits)
            raise ValueError(f"{path}: unsupported file type {suffix!r} (expected .parquet, .json or .jsonl)")
        loaded = datasets.load_dataset(str(path))
        return _read_splits(loaded, splits)
    if isinstance(source, str) and _looks_like_hub_id(source):
        return [row for s in splits for row in _hub_split(source, s)]
    raise FileNotFoundError(f"{source!r} is neither an existing local path nor a hub dataset id")


def _hub_split(repo_id: str, split: str) -> list[dict]:
    import datasets

    return datasets.load_dataset(repo_id, split=split).to_list()


def _check_fields(rows: list[dict], required: Iterable[str], what: str) -> None:
    if not rows:
        raise ValueError(f"{what}: no rows")
    missing = [f for f in required if f not in rows[0]]
    if missing:
        raise ValueError(f"{what}: missing field(s) {missing}; found {sorted(rows[0])}")


def _source_name(source: Any) -> str:
    return str(source) if isinstance(source, (str, Path)) else "in-memory"


def _posq_benchmark(
    name: str, passages: list[str], qids: list[str], questions: list[str], q2p: dict[str, str], groups: dict[str, np.ndarray], meta: dict
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
        qrels={qid: {corpus_ids[p2i[q2p[q]]]: 1} for qid, q in zip(qids, questions)},
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
    rows = _read_splits(source, ("train", "validation"))
    _check_fields(rows, ("question", "context", "answers"), "SQuAD-PosQ")
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
        {"source": _source_name(source), "convention": convention, "sample": sample},
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


def load_fineweb_posq(source: Any = FINEWEB_HUB_ID, *, sample_per_group: int | None = None, seed: int = 42) -> RetrievalBenchmark:
    """FineWeb-PosQ.

    Reproduces the reference: rows with a question are queries (positive = the
    content of the last row with that question text); every row's content is in
    the corpus (deduplicated, sorted).  ``sample_per_group=1000`` is the
    reference's sampled variant (shuffle with seed 42, first 1,000 queries of
    each group, duplicates of a question text dropped).
    """
    rows = _read_splits(source, ("train",))
    _check_fields(rows, ("question", "content", "span_class"), "FineWeb-PosQ")
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
        picked = [q for c in ("beginning", "middle", "end") for q in [q for q in queries if c in q[1]][:sample_per_group]]
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
        {"source": _source_name(source), "sample_per_group": sample_per_group},
    )


_POSIR_QUERY_COLS = ("_id", "text", "pos_char_span", "pos_char_length", "pos_token_length")


def _posir_root(source: Any, langs: Sequence[str]) -> Path:
    if _is_local(source):
        root = Path(source).expanduser()
        if not root.is_dir():
            raise ValueError(f"{root}: a PosIR source must be a directory <root>/<lang-Script>/<domain>/...")
        return root
    if isinstance(source, str) and _looks_like_hub_id(source):
        from huggingface_hub import snapshot_download

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
        available = sorted(p.name for p in root.iterdir() if p.is_dir() and _POSIR_DIR.match(p.name))
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
        for qid, did, score in zip(r["query-id"].astype(str), r["corpus-id"].astype(str), r["score"]):
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
    relpos = np.array([posir_relative_position(s, n) for s, n in zip(q["pos_char_span"], q["pos_char_length"])])
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
        query_ids=[f"{d}/{i}" for d, i in zip(q["domain"], q["_id"])],
        query_texts=q["text"].tolist(),
        qrels=qrels,
        groups=groups,
        length_bucket=buckets,
        relpos=relpos,
        query_domains=q["domain"].tolist(),
        corpus_domains=c["domain"].tolist(),
        meta=meta,
    )


_NAMED = {
    "squad-posq": lambda **kw: load_squad_posq(convention=kw.get("convention", "inclusive")),
    "squad-posq-tiny": lambda **kw: load_squad_posq(sample=10_000, convention=kw.get("convention", "inclusive")),
    "fineweb-posq": lambda **kw: load_fineweb_posq(),
    "posir": lambda **kw: load_posir(lang=kw.get("lang") or "eng-Latn", corpus_lang=kw.get("corpus_lang"), domains=kw.get("domains")),
}


def load_benchmark(
    name_or_path: str,
    *,
    lang: str | None = None,
    corpus_lang: str | None = None,
    domains: Sequence[str] | None = None,
    convention: str = "inclusive",
) -> RetrievalBenchmark:
    """A benchmark by name (``squad-posq``, ``squad-posq-tiny``, ``fineweb-posq``, ``posir``),
    by hub id, or by local path (layout detected: PosIR tree, SQuAD rows, FineWeb-PosQ rows)."""
    kw = {"lang": lang, "corpus_lang": corpus_lang, "domains": domains, "convention": convention}
    key = name_or_path.lower()
    if key in _NAMED:
        return _NAMED[key](**kw)
    if name_or_path == SQUAD_HUB_ID:
        return load_squad_posq(name_or_path, convention=convention)
    if name_or_path == FINEWEB_HUB_ID:
        return load_fineweb_posq(name_or_path)
    if name_or_path == POSIR_HUB_ID:
        return load_posir(name_or_path, lang=lang or "eng-Latn", corpus_lang=corpus_lang, domains=domains)
    if _is_local(name_or_path):
        path = Path(name_or_path).expanduser()
        if path.is_dir() and any(p.is_dir() and _POSIR_DIR.match(p.name) for p in path.iterdir()):
            if lang is None:
                langs = sorted(p.name for p in path.iterdir() if p.is_dir() and _POSIR_DIR.match(p.name))
                lang = "eng-Latn" if "eng-Latn" in langs else langs[0]
            return load_posir(path, lang=lang, corpus_lang=corpus_lang, domains=domains)
        rows = _read_splits(path, ("train", "validation"))
        if rows and "span_class" in rows[0]:
            return load_fineweb_posq(rows)
        if rows and "answers" in rows[0]:
            return load_squad_posq(rows, convention=convention)
        raise ValueError(f"{path}: not a PosIR tree and its rows have neither SQuAD ('answers') nor FineWeb-PosQ ('span_class') fields")
    raise ValueError(
        f"unknown benchmark {name_or_path!r}: use one of {sorted(_NAMED)}, a hub id "
        f"({SQUAD_HUB_ID}, {FINEWEB_HUB_ID}, {POSIR_HUB_ID}) or an existing path"
    )


# --------------------------------------------------------------------------------------
# building a benchmark from an aligned corpus


def build_from_corpus(
    corpus: pd.DataFrame,
    out_dir: str | Path,
    *,
    langs: Sequence[str] = ("en",),
    k: int = 3,
    seed: int = 0,
    name: str = "aligned",
    domain: str = "all",
    max_doc_tokens: int | None = 510,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
    separator: str = "\n\n",
    budget_langs: Sequence[str] | None = None,
    max_seq_length: int | None = None,
) -> Path:
    """Build a position-aware benchmark from an aligned corpus and save it in PosIR's layout.

    ``corpus`` has one row per (segment ``id``, ``lang``) with ``text`` and
    ``title`` (the text excludes the title).  Segments present with a non-empty
    title and text in every language of ``langs`` are used.  If
    ``max_doc_tokens`` is set, segments longer than ``max_doc_tokens // k``
    tokens in any language are dropped, so every document of k segments fits
    (token counts from ``count_tokens(texts)`` - without special tokens - or
    else from the corpus column ``n_tokens_minilm``); ``budget_langs`` limits
    that check to the languages whose documents will be searched (e.g. ``["en"]``
    for en and de -> en retrieval; default: every language).  The remaining segments
    are shuffled (``numpy.random.default_rng(seed)``) and cut into documents of
    k consecutive segments (the last document may be shorter); every segment is
    in exactly one document, and documents have the same ids and segment order
    in every language.  For each segment the query is its title; the relevant
    document is the one holding it.  Per language ``<lang-Script>/<domain>/``
    gets ``corpus.parquet`` (``_id, text``), ``queries.parquet`` (PosIR columns
    + ``segment_id, segment_position, n_segments``) and ``qrels/test.parquet``;
    ``benchmark.json`` records the construction (with ``max_seq_length``, the token
    limit of the model the budget was derived from, when given).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    if not langs:
        raise ValueError("langs must name at least one language")
    missing = [c for c in ("id", "lang", "text", "title") if c not in corpus.columns]
    if missing:
        raise ValueError(f"corpus is missing column(s) {missing}; found {list(corpus.columns)}")
    df = corpus.copy()
    df["id"] = df["id"].astype(str)
    df = df[df["text"].fillna("").str.strip().ne("") & df["title"].fillna("").str.strip().ne("")]
    per_lang = {}
    for lang in langs:
        sub = df[df["lang"] == lang]
        if sub.empty:
            raise ValueError(
                f"corpus has no usable rows (non-empty title and text) in language {lang!r}; languages: {sorted(corpus['lang'].unique())}"
            )
        if sub["id"].duplicated().any():
            raise ValueError(f"corpus has duplicate ids in language {lang!r}: {sub['id'][sub['id'].duplicated()].tolist()[:5]}")
        per_lang[lang] = sub.set_index("id")
    ids = sorted(set.intersection(*(set(s.index) for s in per_lang.values())))
    if not ids:
        raise ValueError(f"no segment id is present in every language of {list(langs)}")
    n_aligned = len(ids)
    n_tokens: dict[str, pd.Series] = {}
    for lang, sub in per_lang.items():
        if count_tokens is not None:
            n_tokens[lang] = pd.Series([int(n) for n in count_tokens(sub.loc[ids, "text"].tolist())], index=ids)
        elif "n_tokens_minilm" in sub.columns:
            n_tokens[lang] = sub.loc[ids, "n_tokens_minilm"].astype(int)
    if max_doc_tokens is not None:
        if not n_tokens:
            raise ValueError("max_doc_tokens needs token counts: pass count_tokens or a corpus with an 'n_tokens_minilm' column")
        cap = max_doc_tokens // k
        keep = set(ids)
        checked = [lang for lang in (budget_langs or langs)]
        unknown = set(checked) - set(langs)
        if unknown:
            raise ValueError(f"budget_langs {sorted(unknown)} are not among langs {list(langs)}")
        for lang in checked:
            counts = n_tokens[lang]
            keep &= set(counts.index[counts <= cap])
        ids = [i for i in ids if i in keep]
        if not ids:
            raise ValueError(f"no segment has at most {cap} tokens (max_doc_tokens={max_doc_tokens}, k={k}) in every language")
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    docs = [order[i : i + k] for i in range(0, len(order), k)]
    width = len(str(len(docs)))
    doc_ids = [f"d{j:0{width}d}" for j in range(len(docs))]
    out = Path(out_dir)
    for lang, sub in per_lang.items():
        ldir = out / posir_lang(lang) / domain
        corpus_rows, query_rows, qrel_rows = [], [], []
        for did, segs in zip(doc_ids, docs):
            parts, spans, pos = [], [], 0
            for s in segs:
                text = sub.at[s, "text"]
                spans.append((pos, pos + len(text)))
                parts.append(text)
                pos += len(text) + len(separator)
            doc_text = separator.join(parts)
            tok = int(sum(int(n_tokens[lang][s]) for s in segs)) if lang in n_tokens else None
            corpus_rows.append({"_id": did, "text": doc_text})
            for p, (s, span) in enumerate(zip(segs, spans), start=1):
                qid = f"q-{s}"
                query_rows.append(
                    {
                        "_id": qid,
                        "text": sub.at[s, "title"],
                        "pos_char_span": list(span),
                        "pos_char_length": len(doc_text),
                        "pos_token_length": tok,
                        "segment_id": s,
                        "segment_position": p,
                        "n_segments": len(segs),
                    }
                )
                qrel_rows.append({"query-id": qid, "corpus-id": did, "score": 1})
        atomic_write_parquet(ldir / "corpus.parquet", pd.DataFrame(corpus_rows))
        atomic_write_parquet(ldir / "queries.parquet", pd.DataFrame(query_rows))
        atomic_write_parquet(ldir / "qrels" / "test.parquet", pd.DataFrame(qrel_rows))
    atomic_write_json(
        out / "benchmark.json",
        {
            "name": name,
            "domain": domain,
            "langs": [posir_lang(x) for x in langs],
            "k": k,
            "seed": seed,
            "max_doc_tokens": max_doc_tokens,
            "max_seq_length": max_seq_length,
            "budget_langs": [posir_lang(x) for x in (budget_langs or langs)],
            "segments_aligned": n_aligned,
            "segments_used": len(ids),
            "segments_dropped_too_long": n_aligned - len(ids),
            "documents": len(docs),
            "separator": separator,
            "token_counts": "count_tokens" if count_tokens is not None else ("n_tokens_minilm" if n_tokens else None),
        },
    )
    return out
