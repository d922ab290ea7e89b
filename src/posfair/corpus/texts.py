"""Texts to embed: the one reader of ``posfair embed``'s input (and of any job embedding a corpus).

:func:`read_corpus_texts` takes a posfair corpus (via :func:`~posfair.corpus.load_corpus`),
a plain ``.parquet`` / ``.jsonl`` file whose ``text_field`` holds the texts (only that
column is read), or -- with ``benchmark_part`` -- a retrieval benchmark in PosIR's layout
(:mod:`posfair.corpus.posir_layout`), and returns the texts with a description of their source.
Every text must be a non-empty string (ValueError naming the file and line or row).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from posfair.corpus.aligned import load_corpus
from posfair.corpus.posir_layout import POSIR_HUB_ID, is_posir_tree, posir_languages, read_posir
from posfair.files.reading import check_texts, jsonl_records, read_utf8, split_lines

__all__ = ["BENCHMARK_PARTS", "read_benchmark_texts", "read_corpus_texts"]

BENCHMARK_PARTS = ("documents", "queries")


def read_corpus_texts(
    source: str | None,
    *,
    text_field: str = "text",
    unit: str | None = None,
    langs: Sequence[str] | None = None,
    benchmark_part: str | None = None,
    lang: str | None = None,
) -> tuple[list[str], str]:
    """Texts to embed and a description of their source.

    ``source``: None/"bundled" (the bundled corpus), a posfair corpus (.parquet /
    .jsonl / save_to_disk folder / HF dataset, via :func:`posfair.corpus.load_corpus`),
    or a plain .parquet / .jsonl whose ``text_field`` holds the texts (only that
    column is read).  With ``benchmark_part`` ("documents" or "queries"), ``source``
    is a benchmark in PosIR's layout: see :func:`read_benchmark_texts`.
    """
    if benchmark_part is not None:
        return read_benchmark_texts(source, benchmark_part, lang=lang)
    path = Path(source).expanduser() if source not in (None, "bundled") else None
    plain = path is not None and path.is_file() and path.suffix.lower() in (".parquet", ".pq", ".jsonl", ".json")
    if plain and (text_field != "text" or not _has_posfair_fields(path)):
        return _read_text_column(path, text_field), f"{path} [{text_field}]"
    df = load_corpus(source, unit=unit, langs=langs)
    if text_field not in df.columns:
        raise ValueError(f"corpus {source or 'bundled'} has no field {text_field!r} (fields: {list(df.columns)})")
    desc = (
        f"{source or 'bundled'} [{text_field}]"
        + (f" unit={unit}" if unit else "")
        + (f" langs={','.join(langs)}" if langs else "")
    )
    return check_texts(df[text_field].tolist(), f"corpus {source or 'bundled'}", text_field), desc


def read_benchmark_texts(source: str | None, part: str, *, lang: str | None = None) -> tuple[list[str], str]:
    """The document (``part="documents"``) or query texts of a benchmark in PosIR's layout, and a description.

    ``source``: a folder in PosIR's layout (``posfair build-benchmark`` output, a PosIR
    download), ``"posir"`` or PosIR's hub id.  ``lang``: the language (default:
    ``eng-Latn`` when present, else the first).  Every complete domain, in order, as
    ``posfair.retrieval.load_benchmark`` reads it.  Benchmarks of another layout
    (SQuAD-PosQ, FineWeb-PosQ) are refused: their texts are built by
    ``posfair.retrieval.load_benchmark`` (``corpus_texts`` / ``query_texts``).
    """
    if part not in BENCHMARK_PARTS:
        raise ValueError(f"benchmark part must be 'documents' or 'queries'; got {part!r}")
    if source is not None and str(source).lower() == "posir":
        source = POSIR_HUB_ID
    if source == POSIR_HUB_ID:
        tables = read_posir(source, lang=lang or "eng-Latn")
    elif source is not None and is_posir_tree(source):
        if lang is None:
            langs = posir_languages(Path(source).expanduser())
            lang = "eng-Latn" if "eng-Latn" in langs else langs[0]
        tables = read_posir(source, lang=lang)
    else:
        raise ValueError(
            f"{source}: not a benchmark in PosIR's layout (<lang-Script>/<domain>/corpus.parquet, queries.parquet, "
            f"qrels/test.parquet; 'posir' or {POSIR_HUB_ID}); for SQuAD-PosQ or FineWeb-PosQ use "
            "posfair.retrieval.load_benchmark(...).corpus_texts / .query_texts"
        )
    frame = tables.corpus if part == "documents" else tables.queries
    return frame["text"].tolist(), f"benchmark {tables.name} ({part})"


def _has_posfair_fields(path: Path) -> bool:
    if path.suffix.lower() in (".parquet", ".pq"):
        names = set(pq.read_schema(path).names)
    else:  # a file that is not UTF-8 is refused naming the line and the byte, as every input file
        first = next((line for line in split_lines(read_utf8(path)) if line.strip()), "{}")
        try:
            rec = json.loads(first)
        except json.JSONDecodeError:
            return False  # read as plain records, which names the line that is not JSON
        names = set(rec) if isinstance(rec, dict) else set()
    return {"id", "lang", "text"} <= names


def _read_text_column(path: Path, field: str) -> list[str]:
    lines = None
    if path.suffix.lower() in (".parquet", ".pq"):
        if field not in pq.read_schema(path).names:
            raise ValueError(f"{path}: no column {field!r} (columns: {pq.read_schema(path).names})")
        texts = pq.read_table(path, columns=[field]).column(field).to_pylist()
    else:
        texts, lines = [], []
        records = jsonl_records(split_lines(read_utf8(path)), path, expected=f"an object with a {field!r} field")
        for n, rec in records:
            if field not in rec:
                raise ValueError(f"{path}: line {n} has no field {field!r}")
            texts.append(rec[field])
            lines.append(n)
    return check_texts(texts, str(path), field, lines)
