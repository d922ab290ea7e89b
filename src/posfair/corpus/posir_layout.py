"""PosIR's on-disk layout: per language and domain, a corpus, queries and qrels as Parquet files.

::

    ROOT/
      benchmark.json                     (optional) how a built benchmark was made; its "name"
      <lang-Script>/<domain>/corpus.parquet        _id, text
      <lang-Script>/<domain>/queries.parquet       _id, text, ... (PosIR's position columns)
      <lang-Script>/<domain>/qrels/test.parquet    query-id, corpus-id, score (a finite number)

The published ``infgrad/PosIR-Benchmark-v1`` has this layout, and
``posfair.retrieval.build_from_corpus`` writes it from a posfair corpus.  This module
reads the tables of one language (queries and qrels of ``lang`` against the corpus of
``corpus_lang``), domain by domain, as the reference scripts do: a domain missing any
of its three files is skipped with a warning.  What the tables mean for retrieval
(position groups, length buckets) is :mod:`posfair.retrieval`'s business.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from huggingface_hub import snapshot_download

from posfair.files.reading import is_local, looks_like_hub_id
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "POSIR_DIR",
    "POSIR_HUB_ID",
    "POSIR_LANGS",
    "PosirTables",
    "is_posir_tree",
    "is_score",
    "posir_lang",
    "posir_languages",
    "posir_root",
    "read_posir",
]

POSIR_HUB_ID = "infgrad/PosIR-Benchmark-v1"
POSIR_LANGS = (
    "ara-Arab",
    "cmn-Hans",
    "deu-Latn",
    "eng-Latn",
    "fra-Latn",
    "ita-Latn",
    "kor-Kore",
    "por-Latn",
    "rus-Cyrl",
    "spa-Latn",
)
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
#: a language directory's name: ISO 639-3 code, dash, ISO 15924 script
POSIR_DIR = re.compile(r"^[a-z]{3}-[A-Z][a-z]{3}$")
# the columns of the layout itself (PosIR's position columns are retrieval's to check)
_COLUMNS = {"queries": ("_id", "text"), "corpus": ("_id", "text"), "qrels": ("query-id", "corpus-id", "score")}


def is_score(value: Any) -> bool:
    """Whether ``value`` can be a qrels score: a finite real number (not a bool, not null, NaN or an infinity)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def describe_number(value: Any) -> str:
    """How a value that should be a number is named in an error: ``null``, ``NaN``, ``inf``, ``a str ('x')``."""
    if value is None or value is pd.NA or value is pd.NaT:
        return "null"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return str(float(value)) if not math.isfinite(float(value)) else str(value)
    shown = repr(value)
    return f"a {type(value).__name__} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


def _check_qrels(r: pd.DataFrame, path: Path) -> None:
    """ValueError naming the file and row (0-based) of the first qrels score that is not a finite number, or of
    a (query-id, corpus-id) pair listed again with another score."""
    scores = r["score"].tolist()
    for i, v in enumerate(scores):
        if not is_score(v):
            raise ValueError(f"{path}: row {i}: 'score' is {describe_number(v)}: a qrels score must be a finite number")
    seen: dict[tuple[str, str], int] = {}
    for i, pair in enumerate(zip(r["query-id"].astype(str), r["corpus-id"].astype(str), strict=True)):
        j = seen.setdefault(pair, i)
        if j != i and float(scores[j]) != float(scores[i]):
            raise ValueError(
                f"{path}: rows {j} and {i} give query {pair[0]!r}, document {pair[1]!r} two scores "
                f"({scores[j]} and {scores[i]}): a pair has one score"
            )


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


def posir_languages(root: str | Path) -> list[str]:
    """The language directories under ``root``, sorted."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and POSIR_DIR.match(p.name))


def is_posir_tree(path: str | Path) -> bool:
    """Whether ``path`` is a folder with at least one PosIR language directory."""
    path = Path(path).expanduser()
    return path.is_dir() and bool(posir_languages(path))


def posir_root(source: Any, langs: Sequence[str]) -> Path:
    """The local root of a PosIR-layout source: a folder as is; a hub dataset id downloaded
    (only the folders of ``langs``)."""
    if is_local(source):
        root = Path(source).expanduser()
        if not root.is_dir():
            raise ValueError(f"{root}: a PosIR source must be a directory <root>/<lang-Script>/<domain>/...")
        return root
    if isinstance(source, str) and looks_like_hub_id(source):
        return Path(
            snapshot_download(repo_id=source, repo_type="dataset", allow_patterns=[f"{lang}/**" for lang in langs])
        )
    raise FileNotFoundError(f"{source!r} is neither an existing local directory nor a hub dataset id")


@dataclass
class PosirTables:
    """The tables of one language of a PosIR-layout source, every complete domain concatenated.

    ``queries`` and ``corpus`` have ``_id`` as strings and a ``domain`` column; ``qrels``
    holds the rows of the listed queries only, with a ``domain`` column.
    """

    root: Path
    lang: str
    corpus_lang: str
    queries: pd.DataFrame
    corpus: pd.DataFrame
    qrels: pd.DataFrame
    built: dict[str, Any] | None = None  # benchmark.json, when the source has one
    skipped: list[str] = field(default_factory=list)  # domains missing a file

    @property
    def name(self) -> str:
        """``posir[eng-Latn]``, ``posir[deu-Latn->eng-Latn]``; a built benchmark's own name instead of ``posir``."""
        base = self.built.get("name", self.root.name) if self.built is not None else "posir"
        return f"{base}[{self.lang}]" if self.corpus_lang == self.lang else f"{base}[{self.lang}->{self.corpus_lang}]"


def read_posir(
    source: Any = POSIR_HUB_ID,
    *,
    lang: str = "eng-Latn",
    corpus_lang: str | None = None,
    domains: Sequence[str] | None = None,
) -> PosirTables:
    """The queries and qrels of ``lang`` and the corpus of ``corpus_lang`` (default: ``lang``) of
    a PosIR-layout source (a folder or a hub id), domain by domain.

    ``domains``: only these (ValueError for an unknown one).  A domain missing any of its
    three files is skipped with a warning; none complete is a ValueError.
    """
    lang = posir_lang(lang)
    corpus_lang = posir_lang(corpus_lang) if corpus_lang else lang
    root = posir_root(source, sorted({lang, corpus_lang}))
    qdir = root / lang
    if not qdir.is_dir():
        raise ValueError(f"{root}: no language directory {lang!r}; available: {posir_languages(root)}")
    domain_dirs = sorted(p for p in qdir.iterdir() if p.is_dir())
    if domains is not None:
        wanted = set(domains)
        unknown = wanted - {p.name for p in domain_dirs}
        if unknown:
            raise ValueError(f"{qdir}: unknown domain(s) {sorted(unknown)}")
        domain_dirs = [p for p in domain_dirs if p.name in wanted]
    frames_q, frames_c, frames_r, skipped = [], [], [], []
    for ddir in domain_dirs:
        qpath, rpath = ddir / "queries.parquet", ddir / "qrels" / "test.parquet"
        cpath = root / corpus_lang / ddir.name / "corpus.parquet"
        if not (qpath.exists() and rpath.exists() and cpath.exists()):
            skipped.append(ddir.name)
            continue
        q, c, r = pd.read_parquet(qpath), pd.read_parquet(cpath), pd.read_parquet(rpath)
        for df, kind, path in ((q, "queries", qpath), (c, "corpus", cpath), (r, "qrels", rpath)):
            missing = [col for col in _COLUMNS[kind] if col not in df.columns]
            if missing:
                raise ValueError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
        _check_qrels(r, rpath)
        q = q.assign(_id=q["_id"].astype(str), domain=ddir.name)
        c = c.assign(_id=c["_id"].astype(str), domain=ddir.name)
        r = r[r["query-id"].astype(str).isin(set(q["_id"]))].assign(domain=ddir.name)
        frames_q.append(q)
        frames_c.append(c)
        frames_r.append(r)
    if skipped:
        warnings.warn(
            f"PosIR {lang}->{corpus_lang}: skipped domain(s) with missing files: {skipped}",
            stacklevel=user_stacklevel(),
        )
    if not frames_q:
        raise ValueError(
            f"{root}: no complete domain for {lang} -> {corpus_lang} (need queries.parquet, qrels/test.parquet and the corpus)"
        )
    meta_file = root / "benchmark.json"
    built = json.loads(meta_file.read_text()) if meta_file.exists() else None
    return PosirTables(
        root=root,
        lang=lang,
        corpus_lang=corpus_lang,
        queries=pd.concat(frames_q, ignore_index=True),
        corpus=pd.concat(frames_c, ignore_index=True),
        qrels=pd.concat(frames_r, ignore_index=True),
        built=built,
        skipped=skipped,
    )
