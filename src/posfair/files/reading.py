"""Reading what a user gives posfair: the texts and ids of an input file (``posfair encode``), JSON-lines records,
and telling a local source from a hub id; each mistake named in one :class:`~posfair.runtime.errors.PosfairInputError`."""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel


def describe_value(value: Any) -> str:
    """How an unusable text value is named in error messages: ``null``, ``empty``, ``an int (123)``..."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null"
    if isinstance(value, str):
        return "empty" if not value.strip() else repr(value)
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({shown}), not a string"


def has_content(text: Any) -> bool:
    """Whether ``text`` is a string with something to embed: a character that is neither white space nor
    invisible (control and format characters such as a zero-width space or a byte-order mark, unassigned
    code points).  A text without one is as empty as an empty line: the tokenizers drop such characters,
    so every such text would come out as the same vector."""
    return isinstance(text, str) and any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text)


_INVISIBLE = frozenset({"Cc", "Cf", "Cn", "Zs", "Zl", "Zp"})


def _describe_text(value: Any) -> str:
    if isinstance(value, str) and value.strip() and not has_content(value):
        shown = ", ".join(sorted({f"U+{ord(c):04X}" for c in value if not c.isspace()})[:3])
        return f"empty (only invisible characters: {shown})"
    return describe_value(value)


def check_ids(ids: Sequence[Any], source: str, field: str, lines: Sequence[int] | None = None) -> list:
    """``ids`` if they are all strings or all integers (as JSON or Parquet holds them; they are copied to the
    output as they are); else PosfairInputError naming the first id that is null, of another kind, or of
    another type than the first one, an integer a Parquet column cannot hold (all must fit 64 bits, signed, or
    unsigned when none is negative), or a string Parquet cannot hold (an unpaired UTF-16 surrogate, which a
    JSON escape such as ``\\ud800`` can make).  Ids that occur more than once are kept, with one warning
    counting them."""
    ids = list(ids)

    def where(i: int) -> str:
        return f"line {lines[i]}" if lines is not None else f"row {i}"

    def kind(v: Any) -> str | None:
        if isinstance(v, str):
            return "str"
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            return "int"
        return None

    first_kind = kind(ids[0]) if ids else None
    for i, v in enumerate(ids):
        k = kind(v)
        if k is None:
            raise PosfairInputError(
                f"{source}: {where(i)}: {field!r} is {describe_value(v).replace(', not a string', '')}: ids must be strings or integers"
            )
        if k != first_kind:
            raise PosfairInputError(
                f"{source}: {where(i)}: {field!r} is {describe_value(v).replace(', not a string', '')} but the first id "
                f"({where(0)}) is {'a string' if first_kind == 'str' else 'an integer'}: ids must all be strings or all integers"
            )
    if first_kind == "str":
        for i, v in enumerate(ids):
            if _surrogates(v):
                raise PosfairInputError(f"{source}: {where(i)}: {field!r} holds {_surrogates(v)}")
    else:
        _check_integer_range(ids, where, source, field)
    seen: dict[Any, int] = {}
    repeated = 0
    first_repeat = None
    for i, v in enumerate(ids):
        key = int(v) if first_kind == "int" else v
        if key in seen:
            repeated += 1
            if first_repeat is None:
                first_repeat = (key, seen[key], i)
        else:
            seen[key] = i
    if first_repeat is not None:
        key, a, b = first_repeat
        warnings.warn(
            f"{source}: {repeated} of {len(ids)} {field!r} values repeat an earlier one (first: {key!r} at {where(a)} and {where(b)}); "
            "they are copied to the output as they are",
            DuplicateIdWarning,
            stacklevel=user_stacklevel(),
        )
    return [int(v) if first_kind == "int" else v for v in ids]


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogates(text: str) -> str:
    """What makes ``text`` unwritable as UTF-8 ("an unpaired UTF-16 surrogate (U+D800 at character 3) ..."), or ""."""
    found = _SURROGATE.search(text)
    if found is None:
        return ""
    return (
        f"an unpaired UTF-16 surrogate (U+{ord(found.group()):04X} at character {found.start() + 1}), which is not "
        "text (a JSON escape such as \\ud800 without its pair)"
    )


def _check_integer_range(ids: Sequence[Any], where: Callable[[int], str], source: str, field: str) -> None:
    """PosfairInputError naming the first integer id a Parquet column of the ids cannot hold: all ids must fit a
    signed 64-bit integer, or an unsigned one when none is negative."""
    values = [int(v) for v in ids]
    if not values:
        return
    negative = next((i for i, v in enumerate(values) if v < 0), None)
    low, high = (-(2**63), 2**63 - 1) if negative is not None else (0, 2**64 - 1)
    for i, v in enumerate(values):
        if not low <= v <= high:
            beside = f" with a negative id ({where(negative)})" if negative is not None and v > 0 else ""
            raise PosfairInputError(
                f"{source}: {where(i)}: {field!r} is {v}, outside the 64-bit integers a Parquet column holds "
                f"({low}..{high}{beside}): give such ids as strings"
            )


class DuplicateIdWarning(UserWarning):
    """Ids of an input repeat (kept, copied to the output as they are)."""


def check_texts(texts: Sequence[Any], source: str, field: str, lines: Sequence[int] | None = None) -> list[str]:
    """``texts`` if every one is a non-empty string; else PosfairInputError (a ValueError) naming the first bad one.

    ``source``: the file (or corpus) named in the message; ``lines``: the file line of
    each text (.jsonl, 1-based), else texts are named by row (0-based, as in pandas).
    An empty ``texts`` is refused too (nothing to embed is never what was meant).
    """
    if len(texts) == 0:
        raise PosfairInputError(f"{source}: no texts to embed (the input is empty)")
    bad = [i for i, t in enumerate(texts) if not has_content(t)]
    if bad:
        i = bad[0]
        where = f"line {lines[i]}" if lines is not None else f"row {i}"
        more = f" ({len(bad)} unusable texts in all)" if len(bad) > 1 else ""
        raise PosfairInputError(f"{source}: {where}: {field!r} is {_describe_text(texts[i])}{more}")
    for i, t in enumerate(texts):
        if _surrogates(t):  # a tokenizer cannot take it (and no Parquet file can hold it)
            where = f"line {lines[i]}" if lines is not None else f"row {i}"
            raise PosfairInputError(f"{source}: {where}: {field!r} holds {_surrogates(t)}")
    return list(texts)


#: the input files :func:`read_texts` reads
TEXT_FILE_TYPES = (".txt", ".jsonl", ".json", ".parquet")


def read_texts(
    path: str | os.PathLike, text_field: str = "text", id_field: str | None = None
) -> tuple[list[str], list | None]:
    """Texts (and ids) from .txt (one text a line), .jsonl/.json (one record a line) or .parquet.

    Raises :class:`~posfair.runtime.errors.PosfairInputError` (a ValueError) naming the file and
    the line (.txt, .jsonl; 1-based) or row (.parquet; 0-based) of the first unusable
    value: a missing field, a null, a non-string or an empty text.  An input without
    texts, a file that is not UTF-8 and a missing file are refused too.
    """
    path = Path(path)
    if not path.exists():
        raise PosfairInputError(f"input file {path} does not exist")
    if path.is_dir():
        raise PosfairInputError(f"input {path} is a folder, not a file")
    suffix = path.suffix.lower()
    ids = None
    if suffix not in TEXT_FILE_TYPES:
        raise PosfairInputError(f"{path}: unsupported input type {suffix!r}: use .txt, .jsonl or .parquet")
    if suffix in (".txt", ".jsonl", ".json"):
        lines = split_lines(read_utf8(path))
    if suffix == ".txt":
        # trailing blank lines end the file; a blank line inside it is refused (output row i = line i + 1)
        while lines and not lines[-1].strip():
            lines.pop()
        texts = check_texts(lines, str(path), "text", list(range(1, len(lines) + 1)))
    elif suffix in (".jsonl", ".json"):
        records, numbers = [], []
        for n, rec in jsonl_records(lines, path, expected=f"an object with a {text_field!r} field"):
            for field in (text_field, id_field) if id_field else (text_field,):
                if field not in rec:
                    raise PosfairInputError(f"{path}: line {n} has no {field!r} field")
            records.append(rec)
            numbers.append(n)
        texts = check_texts([r[text_field] for r in records], str(path), text_field, numbers)
        if id_field:
            ids = check_ids([r[id_field] for r in records], str(path), id_field, numbers)
    else:
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several error types for a file that is not Parquet
            raise PosfairInputError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        for field in (text_field, id_field) if id_field else (text_field,):
            if field not in df.columns:
                raise PosfairInputError(f"{path}: no column {field!r} (columns: {list(df.columns)})")
        texts = check_texts(df[text_field].tolist(), str(path), text_field)
        if id_field:
            # read through Arrow: pandas would turn an integer column holding a null into floats
            ids = check_ids(pq.read_table(path, columns=[id_field]).column(id_field).to_pylist(), str(path), id_field)
    return texts, ids


def read_utf8(path: str | os.PathLike, error: type[Exception] = PosfairInputError) -> str:
    """The text of a file that must be UTF-8 (a byte-order mark at its start is dropped: it is not part of the
    first line).  Else ``error`` in one line naming the file, the line and the byte of that line where the text
    stops being UTF-8 (``data.jsonl: line 3 is not UTF-8 text (invalid start byte at byte 12 of the line)``), or
    why the file cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{path}: line {line} is not UTF-8 text ({exc.reason} at byte {column} of the line)") from None


def split_lines(text: str) -> list[str]:
    """The lines of a file's text, numbered as an editor numbers them: cut at ``\\n`` only (with a ``\\r``
    before it dropped); :meth:`str.splitlines` would also cut at form feeds, U+2028, ... inside a text."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def is_local(source: Any) -> bool:
    """Whether a data source is local: a Path, or a string naming an existing file or folder."""
    return isinstance(source, Path) or (isinstance(source, str) and Path(source).expanduser().exists())


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")


def looks_like_hub_id(source: str) -> bool:
    """Whether ``source`` has the shape of a Hugging Face hub id (``owner/name``)."""
    return bool(_HUB_ID.fullmatch(source))


def jsonl_records(
    lines: Iterable[str],
    path: str | os.PathLike,
    error: type[Exception] = PosfairInputError,
    expected: str = "an object",
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of each non-blank line of a JSON-lines file (1-based numbers).

    ``error`` (naming ``path`` and the line) for a line that is not valid JSON or not a JSON
    object; ``expected`` completes that message (e.g. "an object with a 'text' field").
    """
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise error(f"{path}: line {n} is a JSON {type(rec).__name__}, not {expected}")
        yield n, rec
