"""Load and validate segment corpora: topic-aligned texts in several languages.

A corpus is a table with one row per (topic ``id``, ``lang``) holding the ``text`` of that
topic in that language, plus an optional ``title`` and any further columns.  Rows that
share an ``id`` are translations of each other, which is what mixed-language documents
are built from.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from posfair.files.reading import jsonl_records, read_utf8, split_lines
from posfair.runtime.errors import PosfairInputError

REQUIRED_FIELDS = ("id", "lang", "text")
#: what a corpus record is, for the messages that refuse one
RECORD_FORMAT = (
    "a corpus holds one record per segment: 'id' (the topic: records sharing an id are the same segment in "
    "other languages), 'lang' (e.g. en) and 'text', optionally 'title', 'source' (its document family) and 'unit', "
    'e.g. a .jsonl line {"id": "t1", "lang": "en", "text": "..."}'
)
BASE_COLUMNS = ("id", "lang", "text", "title")
BUNDLED_NAME = "debian_docs.parquet"
BUNDLED_DEFAULT_UNIT = "section"
_FILE_TYPES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_PATH_SUFFIXES = set(_FILE_TYPES) | {".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip", ".xlsx", ".feather"}
_MAX_LISTED_ROWS = 5


class CorpusError(PosfairInputError):
    """A corpus cannot be loaded or fails validation; the message names the problem and rows."""


def corpus_title(name: str) -> str:
    """A corpus as every output names it: ``the bundled corpus (Debian documentation)`` for ``bundled`` ("bundled"
    alone reads as an adjective), else ``corpus NAME``."""
    return "the bundled corpus (Debian documentation)" if name == "bundled" else f"corpus {name}"


def bundled_corpus_path() -> Path:
    """Path of the bundled Debian-documentation corpus (``posfair/data/debian_docs.parquet``).

    Built by ``scripts/build_debian_corpus.py``; licence notices are in
    ``debian_docs.LICENSES.txt`` and build metadata in ``debian_docs.meta.json`` next to it.
    """
    return Path(str(resources.files("posfair") / "data" / BUNDLED_NAME))


def _rows_phrase(rows: Sequence[int]) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_LISTED_ROWS])
    more = ", ..." if len(rows) > _MAX_LISTED_ROWS else ""
    noun = "row" if len(rows) == 1 else "rows"
    return f"{noun} [{shown}{more}] ({len(rows)} {noun}, 0-based)"


def corpus_content_fingerprint(corpus: pd.DataFrame) -> str:
    """A SHA-256 (20 hex digits) of a corpus's content: every column (by name) of every row (in ``lang``, ``id``
    order when they exist), whatever file or path it was read from.  Results made from a corpus are keyed by it."""
    h = hashlib.sha256()
    cols = sorted(str(c) for c in corpus.columns)
    h.update(json.dumps(cols).encode("utf-8"))
    order = [c for c in ("lang", "id") if c in corpus.columns]
    rows = corpus.sort_values(order, kind="stable") if order else corpus
    for row in rows[cols].itertuples(index=False):
        for v in row:
            # a missing value (None, NaN, pd.NA: pandas' str columns keep NaN through astype(str)) is one token
            h.update(b"\x02" if _missing(v) else str(v).encode("utf-8"))
            h.update(b"\x00")
        h.update(b"\x01")
    return h.hexdigest()[:20]


def _missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or an array: not a missing scalar
        return False


def validate_corpus(df: pd.DataFrame, *, origin: str = "corpus") -> pd.DataFrame:
    """Check the corpus invariants and return a normalised copy.

    Checks, in order: required fields ``id``, ``lang``, ``text`` present; no null values in
    them; ``text`` is a string; no empty or whitespace-only texts; no duplicate (id, lang)
    pairs.  Raises :class:`CorpusError` naming the field and the offending rows (0-based
    row numbers of ``df``; for JSONL files row ``r`` is line ``r + 1``).

    The result has ``id`` and ``lang`` as strings, a ``title`` column (null where absent),
    the columns ordered ``id, lang, text, title, <other columns>`` and a fresh RangeIndex.
    """
    if not isinstance(df, pd.DataFrame):
        raise CorpusError(f"{origin}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in df.columns]
    if missing:
        names = ", ".join(repr(f) for f in missing)
        raise CorpusError(
            f"{origin}: missing required field(s) {names}; columns present: {sorted(map(str, df.columns))} "
            f"({RECORD_FORMAT})"
        )
    df = df.reset_index(drop=True)
    nulls = [f"{f!r} at {_rows_phrase(bad)}" for f in REQUIRED_FIELDS if (bad := df.index[df[f].isna()].tolist())]
    if nulls:  # every field's nulls at once, not one field per run
        raise CorpusError(f"{origin}: null value in required field {'; '.join(nulls)}")
    bad = df.index[~df["text"].map(lambda t: isinstance(t, str))].tolist()
    if bad:
        kinds = sorted({type(df.at[r, "text"]).__name__ for r in bad})
        raise CorpusError(f"{origin}: field 'text' must be a string, got {kinds} at {_rows_phrase(bad)}")
    bad = df.index[df["text"].str.strip() == ""].tolist()
    if bad:
        raise CorpusError(f"{origin}: empty or whitespace-only 'text' at {_rows_phrase(bad)}")
    out = df.copy()
    for f in ("id", "lang"):
        out[f] = out[f].map(lambda v: v if isinstance(v, str) else str(v))
    bad = out.index[(out["id"].str.strip() == "") | (out["lang"].str.strip() == "")].tolist()
    if bad:
        raise CorpusError(f"{origin}: empty 'id' or 'lang' at {_rows_phrase(bad)}")
    dup = out.duplicated(["id", "lang"], keep=False)
    if dup.any():
        rows = out.index[dup].tolist()
        first = out.loc[rows[0]]
        raise CorpusError(
            f"{origin}: duplicate (id, lang) pairs at {_rows_phrase(rows)}; e.g. (id={first['id']!r}, lang={first['lang']!r})"
        )
    if "title" not in out.columns:
        out["title"] = None
    extra = [c for c in out.columns if c not in BASE_COLUMNS]
    return out[list(BASE_COLUMNS) + extra]


def _read_jsonl(path: Path) -> pd.DataFrame:
    text = read_utf8(path, CorpusError)  # not UTF-8: the file, the line and the byte, as every input file
    stripped = text.lstrip()
    if stripped.startswith("["):  # a single JSON array of records is accepted too
        try:
            records = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}: invalid JSON array: {e}") from e
        if not all(isinstance(r, dict) for r in records):
            raise CorpusError(f"{path}: the JSON array must hold objects (one record each)")
        return pd.DataFrame.from_records(records)
    records = [rec for _, rec in jsonl_records(split_lines(text), path, CorpusError)]
    if not records:
        raise CorpusError(f"{path}: no records")
    return pd.DataFrame.from_records(records)


def _from_hf(obj: Any, origin: str, split: str | None) -> pd.DataFrame:
    """DataFrame from a ``datasets.Dataset`` or ``DatasetDict`` (choosing ``split``)."""
    import datasets

    if isinstance(obj, datasets.DatasetDict):
        splits = sorted(obj.keys())
        if split is None:
            if len(splits) != 1:
                raise CorpusError(f"{origin}: holds several splits {splits}; pass split=...")
            split = splits[0]
        if split not in obj:
            raise CorpusError(f"{origin}: no split {split!r}; available: {splits}")
        obj = obj[split]
    if not isinstance(obj, datasets.Dataset):
        raise CorpusError(f"{origin}: expected a datasets.Dataset, got {type(obj).__name__}")
    return obj.to_pandas()


def _looks_like_path(s: str) -> bool:
    return (
        s.startswith(("/", "./", "../", "~", "\\"))
        or os.sep + os.sep in s
        or Path(s).suffix.lower() in _PATH_SUFFIXES
        or s.count("/") > 1
    )


def _read_source(source: Any, split: str | None) -> tuple[pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        return source, "DataFrame"
    import datasets

    if isinstance(source, (datasets.Dataset, datasets.DatasetDict)):
        return _from_hf(source, "Dataset", split), "Dataset"
    if not isinstance(source, (str, os.PathLike)):
        raise CorpusError(f"unsupported corpus source of type {type(source).__name__}")

    path = Path(source).expanduser()
    if path.is_dir():
        if not (
            (path / "dataset_info.json").exists()
            or (path / "dataset_dict.json").exists()
            or (path / "state.json").exists()
        ):
            raise CorpusError(
                f"{path}: folder is not a dataset saved with datasets.Dataset.save_to_disk "
                "(no dataset_info.json / dataset_dict.json / state.json)"
            )
        return _from_hf(datasets.load_from_disk(str(path)), str(path), split), str(path)
    if path.is_file():
        kind = _FILE_TYPES.get(path.suffix.lower())
        if kind is None:
            plain = (
                " (a file of plain texts, one a line, is what posfair encode / posfair embed read; an audit needs "
                "its texts aligned by topic and language)"
                if path.suffix.lower() == ".txt"
                else ""
            )
            raise CorpusError(
                f"{path}: unknown corpus file type {path.suffix or '(no suffix)'!r}; "
                f"supported: {sorted(_FILE_TYPES)} or a datasets save_to_disk folder{plain}; {RECORD_FORMAT}"
            )
        if kind == "parquet":
            return pd.read_parquet(path), str(path)
        return _read_jsonl(path), str(path)
    if isinstance(source, os.PathLike) or _looks_like_path(str(source)):
        raise CorpusError(f"corpus path not found: {path}")

    # a Hugging Face hub dataset name ("org/name" or "name")
    name = str(source)
    try:
        ds = datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # hub/network/config errors come in many types
        raise CorpusError(
            f"{name!r} is neither an existing local path nor a loadable Hugging Face dataset: {type(e).__name__}: {e}"
        ) from e
    return _from_hf(ds, name, split), f"hf:{name}"


def _as_list(langs: str | Iterable[str]) -> list[str]:
    return [langs] if isinstance(langs, str) else list(langs)


def load_corpus(
    source: Any = None,
    *,
    unit: str | None = None,
    langs: str | Iterable[str] | None = None,
    split: str | None = None,
) -> pd.DataFrame:
    """Load a topic-aligned multilingual corpus as a DataFrame ``id, lang, text, title, ...``.

    Parameters
    ----------
    source:
        ``None`` or ``"bundled"``: the bundled Debian-documentation corpus (see
        :func:`bundled_corpus_path`).  A path to a ``.jsonl`` / ``.json`` file (one JSON
        record per line, or one JSON array of records), a ``.parquet`` file, or a folder
        written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``).
        Any other string that is not an existing path and does not look like one is taken
        as a Hugging Face dataset name and loaded with ``datasets.load_dataset(name,
        split=split or "train")``.  A DataFrame or ``datasets.Dataset`` is validated as is.
    unit:
        Keep rows whose ``unit`` column equals this value ("section" or "packed" in the
        bundled corpus).  Default: ``"section"`` for the bundled corpus, no filter
        otherwise.  Ignored when the corpus has no ``unit`` column.
    langs:
        Keep only these languages (a code or a list of codes).  Every requested language
        must occur in the corpus.
    split:
        Split to use for a Hugging Face dataset or a saved ``DatasetDict``.

    Returns a DataFrame with a fresh index in source order.  Raises :class:`CorpusError`
    for unreadable sources and invalid corpora (see :func:`validate_corpus`).
    """
    bundled = source is None or (isinstance(source, str) and source == "bundled")
    if bundled:
        path = bundled_corpus_path()
        if not path.is_file():
            raise CorpusError(f"bundled corpus not found at {path}; rebuild it with scripts/build_debian_corpus.py")
        raw, origin = pd.read_parquet(path), f"bundled corpus {path.name}"
        if unit is None:
            unit = BUNDLED_DEFAULT_UNIT
    else:
        raw, origin = _read_source(source, split)

    df = validate_corpus(raw, origin=origin)

    if unit is not None and "unit" in df.columns:
        units = sorted(df["unit"].dropna().astype(str).unique())
        if unit not in units:
            raise CorpusError(f"{origin}: no rows with unit={unit!r}; available units: {units}")
        df = df[df["unit"] == unit]

    if langs is not None:
        wanted = _as_list(langs)
        if not wanted:
            raise CorpusError("langs is empty; pass None to keep every language")
        have = set(df["lang"])
        absent = [lang for lang in wanted if lang not in have]
        if absent:
            raise CorpusError(
                f"{origin}: language(s) {absent} not in the corpus"
                + (f" (unit={unit!r})" if unit is not None and "unit" in df.columns else "")
                + f"; available: {sorted(have)}"
            )
        df = df[df["lang"].isin(wanted)]
    return df.reset_index(drop=True)
