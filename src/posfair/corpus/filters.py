"""Length filters for segment corpora (token counts, length windows, the +-70% rule)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from posfair.corpus.aligned import CorpusError


def token_lengths(texts: Iterable[str], tokenizer: Any, *, batch_size: int = 256) -> np.ndarray:
    """Number of tokens of each text, special tokens excluded, as an ``int64`` array.

    ``tokenizer`` is a Hugging Face tokenizer (a fast one is strongly preferred: it
    tokenises a batch in Rust), or a model name/path, which is loaded with
    ``AutoTokenizer.from_pretrained(name, use_fast=True)``.  Texts are tokenised in
    batches of ``batch_size`` without truncation, so texts longer than the model limit
    are counted in full.
    """
    if isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
        from transformers import AutoTokenizer  # heavy (it imports torch): only when given a tokenizer name

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), use_fast=True)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    items = list(texts)
    bad = [i for i, t in enumerate(items) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"token_lengths expects strings; non-strings at positions {bad[:5]} ({len(bad)} in all)")
    out = np.zeros(len(items), dtype=np.int64)
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        enc = tokenizer(batch, add_special_tokens=False, truncation=False, verbose=False)
        out[start : start + len(batch)] = [len(ids) for ids in enc["input_ids"]]
    return out


def _check_lengths(df: pd.DataFrame, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or len(arr) != len(df):
        raise ValueError(f"lengths must be a 1-D sequence aligned with df ({len(df)} rows), got shape {arr.shape}")
    return arr


def filter_by_length(
    df: pd.DataFrame,
    lengths: Sequence[int] | np.ndarray,
    min_tokens: int | None,
    max_tokens: int | None,
) -> pd.DataFrame:
    """Rows whose token length lies in ``[min_tokens, max_tokens]`` (both inclusive).

    ``lengths`` is aligned with the rows of ``df`` by position (e.g. from
    :func:`token_lengths` on ``df["text"]``).  ``None`` leaves a side unbounded.  The
    original index is kept, so ``lengths[result.index]`` works for a RangeIndex ``df``.
    """
    arr = _check_lengths(df, lengths)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise ValueError(f"min_tokens ({min_tokens}) > max_tokens ({max_tokens})")
    mask = np.ones(len(df), dtype=bool)
    if min_tokens is not None:
        mask &= arr >= min_tokens
    if max_tokens is not None:
        mask &= arr <= max_tokens
    return df[mask]


def default_length_window(
    max_seq_length: int,
    n_segments: int,
    *,
    special_tokens: int = 2,
    min_ratio: float = 0.5,
) -> tuple[int, int]:
    """Segment-length window ``(min_tokens, max_tokens)`` scaled to a model's input limit.

    Rule: every document of ``n_segments`` segments must fit the model without
    truncation, so the per-segment budget is

        ``max_tokens = (max_seq_length - special_tokens) // n_segments``

    (``special_tokens`` = 2 for the ``[CLS] ... [SEP]`` / ``<s> ... </s>`` wrappers; the
    segments are joined with whitespace, which adds no tokens), and
    ``min_tokens = ceil(min_ratio * max_tokens)``.  The default ``min_ratio = 0.5`` is the
    papers' ratio (segments of 1,000-2,000 tokens).

    Examples: an 8,192-token model with n = 4 gives (1024, 2047), the papers' window;
    n = 6 gives (683, 1365).  A 512-token model gives (85, 170) for n = 3 and (64, 127)
    for n = 4; ``min_ratio=1/3`` widens the latter to (43, 127).
    """
    if n_segments < 1:
        raise ValueError(f"n_segments must be >= 1, got {n_segments}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    budget = (int(max_seq_length) - int(special_tokens)) // int(n_segments)
    if budget < 1:
        raise ValueError(
            f"{n_segments} segments cannot fit a {max_seq_length}-token model with {special_tokens} special tokens"
        )
    low = max(1, int(np.ceil(min_ratio * budget - 1e-9)))
    return low, budget


def _unique_pairs(df: pd.DataFrame, what: str) -> None:
    for col in ("id", "lang"):
        if col not in df.columns:
            raise CorpusError(f"{what}: missing required field {col!r}")
    dup = df.duplicated(["id", "lang"], keep=False).to_numpy()
    if dup.any():
        rows = np.flatnonzero(dup).tolist()
        raise CorpusError(f"{what}: duplicate (id, lang) pairs at rows {rows[:5]} ({len(rows)} rows, 0-based)")


def filter_by_reference_length(
    df: pd.DataFrame,
    lengths: Sequence[int] | np.ndarray,
    ref_lang: str = "en",
    tolerance: float = 0.7,
) -> pd.DataFrame:
    """The papers' alignment rule: keep a translation only when its length is within
    ``+-tolerance`` of the reference-language version of the same id.

    A row in another language is kept iff the same ``id`` has a ``ref_lang`` row and
    ``|len - ref_len| <= tolerance * ref_len`` (bounds inclusive; with the default 0.7 a
    300-token English text admits translations of 90-510 tokens).  Reference rows are
    always kept; ids without a reference row lose all their translations, since their
    length cannot be checked.  ``lengths`` is aligned with ``df`` by position.  The
    original index is kept.
    """
    arr = _check_lengths(df, lengths).astype(float)
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    _unique_pairs(df, "filter_by_reference_length")
    is_ref = (df["lang"] == ref_lang).to_numpy()
    ref_len = pd.Series(arr[is_ref], index=df["id"].to_numpy()[is_ref])
    matched = df["id"].map(ref_len).to_numpy(dtype=float)
    within = np.abs(arr - matched) <= tolerance * matched + 1e-9
    keep = is_ref | (~np.isnan(matched) & within)
    return df[keep]


def topics_in_all(df: pd.DataFrame, langs: str | Iterable[str]) -> list[str]:
    """Sorted ids that have a row in every language of ``langs``.

    Raises :class:`CorpusError` when ``langs`` is empty or names a language with no row
    at all (a typo would otherwise silently give an empty list).
    """
    wanted = [langs] if isinstance(langs, str) else list(dict.fromkeys(langs))
    if not wanted:
        raise CorpusError("topics_in_all: langs is empty")
    have = set(df["lang"])
    absent = [lang for lang in wanted if lang not in have]
    if absent:
        raise CorpusError(f"topics_in_all: language(s) {absent} not in the corpus; available: {sorted(have)}")
    sub = df[df["lang"].isin(wanted)]
    counts = sub.groupby("id")["lang"].nunique()
    return sorted(str(i) for i in counts.index[counts == len(wanted)])
