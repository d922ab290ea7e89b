"""Building a position-aware benchmark offline from an aligned corpus, saved in PosIR's layout.

:func:`~posfair.retrieval.benchmarks.posir.load_posir` reads it back, with extra
per-segment position groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from posfair.corpus import corpus_content_fingerprint
from posfair.files.atomic import atomic_write_json, atomic_write_parquet
from posfair.files.run_folder import RunFolder
from posfair.model.token_spans import SEGMENT_SEPARATOR, join_segments
from posfair.retrieval.benchmarks.posir import posir_lang
from posfair.runtime.errors import PosfairInputError

__all__ = ["build_from_corpus"]


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
    in every language; a document is its segments joined by :data:`posfair.model.token_spans.SEGMENT_SEPARATOR` (one space,
    as in the audit).  For each segment the query is its title; the relevant
    document is the one holding it.  Per language ``<lang-Script>/<domain>/``
    gets ``corpus.parquet`` (``_id, text``), ``queries.parquet`` (PosIR columns
    + ``segment_id, segment_position, n_segments``) and ``qrels/test.parquet``;
    ``benchmark.json`` records the construction (with ``max_seq_length``, the token
    limit of the model the budget was derived from, when given).
    """
    if k < 1:
        raise PosfairInputError(f"k must be >= 1; got {k}")
    if not langs:
        raise PosfairInputError("langs must name at least one language")
    per_lang, ids = _aligned_segments(corpus, langs)
    n_aligned = len(ids)
    n_tokens = _token_counts(per_lang, ids, count_tokens)
    if max_doc_tokens is not None:
        ids = _within_budget(ids, n_tokens, max_doc_tokens, k, langs, budget_langs)
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    docs = [order[i : i + k] for i in range(0, len(order), k)]
    width = len(str(len(docs)))
    doc_ids = [f"d{j:0{width}d}" for j in range(len(docs))]
    out = Path(out_dir)
    record = {
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
        "separator": SEGMENT_SEPARATOR,
        "token_counts": "count_tokens" if count_tokens is not None else ("n_tokens_minilm" if n_tokens else None),
    }
    # the benchmark is made from the corpus's content, the construction and the documents cut (which hold the token counts)
    key = {"corpus": corpus_content_fingerprint(corpus), "construction": record, "documents": docs}
    # each domain is a run of its own (a benchmark may hold several, built one at a time): the others are left alone
    others = sorted({f"{d.parent.name}/{d.name}" for d in out.glob("*/*") if d.is_dir() and d.name != domain})
    with RunFolder(out, "build-benchmark", key, state=others, part=domain):
        for lang, sub in per_lang.items():
            _write_language(out / posir_lang(lang) / domain, sub, doc_ids, docs, n_tokens.get(lang))
        atomic_write_json(out / "benchmark.json", record)
    return out


def _aligned_segments(corpus: pd.DataFrame, langs: Sequence[str]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Per language the usable rows (non-empty title and text) indexed by id, and the ids present in every language."""
    missing = [c for c in ("id", "lang", "text", "title") if c not in corpus.columns]
    if missing:
        raise PosfairInputError(f"corpus is missing column(s) {missing}; found {list(corpus.columns)}")
    df = corpus.copy()
    df["id"] = df["id"].astype(str)
    df = df[df["text"].fillna("").str.strip().ne("") & df["title"].fillna("").str.strip().ne("")]
    per_lang = {}
    for lang in langs:
        sub = df[df["lang"] == lang]
        if sub.empty:
            raise PosfairInputError(
                f"corpus has no usable rows (non-empty title and text) in language {lang!r}; languages: {sorted(corpus['lang'].unique())}"
            )
        if sub["id"].duplicated().any():
            raise PosfairInputError(
                f"corpus has duplicate ids in language {lang!r}: {sub['id'][sub['id'].duplicated()].tolist()[:5]}"
            )
        per_lang[lang] = sub.set_index("id")
    ids = sorted(set.intersection(*(set(s.index) for s in per_lang.values())))
    if not ids:
        raise PosfairInputError(f"no segment id is present in every language of {list(langs)}")
    return per_lang, ids


def _token_counts(per_lang: dict[str, pd.DataFrame], ids: list[str], count_tokens) -> dict[str, pd.Series]:
    """Per language the segments' token counts (no special tokens): from ``count_tokens``, else the corpus column
    ``n_tokens_minilm``; languages without either are left out."""
    out: dict[str, pd.Series] = {}
    for lang, sub in per_lang.items():
        if count_tokens is not None:
            out[lang] = pd.Series([int(n) for n in count_tokens(sub.loc[ids, "text"].tolist())], index=ids)
        elif "n_tokens_minilm" in sub.columns:
            out[lang] = sub.loc[ids, "n_tokens_minilm"].astype(int)
    return out


def _within_budget(
    ids: list[str],
    n_tokens: dict[str, pd.Series],
    max_doc_tokens: int,
    k: int,
    langs: Sequence[str],
    budget_langs: Sequence[str] | None,
) -> list[str]:
    """The ids whose segment has at most ``max_doc_tokens // k`` tokens in every budget language."""
    if not n_tokens:
        raise PosfairInputError(
            "max_doc_tokens needs token counts: pass count_tokens or a corpus with an 'n_tokens_minilm' column"
        )
    cap = max_doc_tokens // k
    checked = list(budget_langs or langs)
    unknown = set(checked) - set(langs)
    if unknown:
        raise PosfairInputError(f"budget_langs {sorted(unknown)} are not among langs {list(langs)}")
    keep = set(ids)
    for lang in checked:
        counts = n_tokens[lang]
        keep &= set(counts.index[counts <= cap])
    out = [i for i in ids if i in keep]
    if not out:
        raise PosfairInputError(
            f"no segment has at most {cap} tokens (max_doc_tokens={max_doc_tokens}, k={k}) in every language"
        )
    return out


def _write_language(
    ldir: Path, sub: pd.DataFrame, doc_ids: list[str], docs: list[list[str]], n_tokens: pd.Series | None
) -> None:
    """One language's ``corpus.parquet``, ``queries.parquet`` (a segment's title asks for its document) and qrels."""
    corpus_rows, query_rows, qrel_rows = [], [], []
    for did, segs in zip(doc_ids, docs, strict=True):
        doc_text, spans = join_segments([sub.at[s, "text"] for s in segs])
        tok = int(sum(int(n_tokens[s]) for s in segs)) if n_tokens is not None else None
        corpus_rows.append({"_id": did, "text": doc_text})
        for p, (s, span) in enumerate(zip(segs, spans, strict=True), start=1):
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
