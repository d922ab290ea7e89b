"""Length-aware batching: fewer padding tokens, and batch size bounded by a token budget.

A transformer pads every text of a batch to the batch's longest text, so a batch
mixing a 20-token and a 500-token text spends 480 forward-pass tokens on padding.
:func:`length_aware_batches` sorts a shard's texts by token length and cuts the
sorted run into batches whose *padded* size (texts x longest text) stays within
``max_tokens`` -- short texts travel in big batches, long ones in small batches,
so activation memory is bounded by the budget whatever the lengths.

:func:`padding_waste` measures a batching: padding tokens / real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["Batching", "fixed_batches", "length_aware_batches", "padding_waste", "padded_tokens"]

#: how texts are cut into forward passes (``posfair embed --batching``): sorted by token length within a padded-token
#: budget (:func:`length_aware_batches`), or sentence-transformers' own fixed-size batches
Batching = Literal["length", "fixed"]


def fixed_batches(n: int, batch_size: int) -> list[np.ndarray]:
    """Batches of ``batch_size`` consecutive indices in input order (no sorting): the naive batching."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    return [np.arange(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def length_aware_batches(
    lengths: Sequence[int], max_tokens: int, max_batch_size: int | None = None
) -> list[np.ndarray]:
    """Index batches of texts sorted by length (longest first), each within a padded-token budget.

    A batch holds at most ``max_batch_size`` texts, and its padded size -- number of
    texts x its longest text's length -- is at most ``max_tokens``; a single text
    longer than ``max_tokens`` gets a batch of its own.  The sort is stable, so the
    batching is a deterministic function of the lengths.  Longest first means the
    first batch shows the peak memory at once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1; got {max_tokens}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)  # sorted: the first of a batch is its longest
        size = max(1, max_tokens // longest)
        if max_batch_size is not None:
            size = min(size, max_batch_size)
        batches.append(order[start : start + size])
        start += size
    return batches


def padded_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(real tokens, padded tokens) of a batching: padded = sum over batches of size x longest."""
    lengths = np.asarray(lengths, dtype=np.int64)
    real = padded = 0
    for b in batches:
        sub = lengths[np.asarray(b, dtype=np.int64)]
        if len(sub):
            real += int(sub.sum())
            padded += int(len(sub) * sub.max())
    return real, padded


def padding_waste(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Padding tokens / real tokens of a batching (0 = no padding; 1 = as many pad tokens as real ones)."""
    real, padded = padded_tokens(lengths, batches)
    if real == 0:
        raise ValueError("padding waste is undefined without tokens")
    return (padded - real) / real
