"""Token spans: which token of a tokenised text belongs to which character span, and span pooling.

Numpy only (no torch): the audit's document construction imports it before any model is
loaded.  The audit's contextualised segments (tau) and the late-chunking retrieval strategy
(:mod:`posfair.retrieval.late`) both pool token states with :func:`contextualised_segments`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SEGMENT_SEPARATOR", "join_segments", "token_segment_index", "contextualised_segments", "added_token_count"]

#: How segments are joined into a document, in the audit and in a benchmark built from a corpus alike: one space
#: (the papers' "concatenation with whitespace").  The bundled models' tokenizers read a blank line as they read a
#: space (same tokens), so the rule fixes character offsets, not what the model sees.
SEGMENT_SEPARATOR = " "


def join_segments(texts: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """Join ``texts`` with :data:`SEGMENT_SEPARATOR`; return the document and each segment's character span."""
    spans, pos = [], 0
    for i, t in enumerate(texts):
        if i:
            pos += len(SEGMENT_SEPARATOR)
        spans.append((pos, pos + len(t)))
        pos += len(t)
    return SEGMENT_SEPARATOR.join(texts), spans


def token_segment_index(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]], special_mask: Sequence[int] | None = None
) -> np.ndarray:
    """For each token, the 0-based segment it belongs to, or -1 (special tokens, pure whitespace).

    A token is assigned to the segment its character offsets overlap most; tokens
    with an empty offset range (special tokens in fast tokenizers) or flagged in
    ``special_mask`` belong to no segment.
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    overlap = np.minimum(off[:, None, 1], sp[None, :, 1]) - np.maximum(off[:, None, 0], sp[None, :, 0])
    overlap = np.clip(overlap, 0, None)
    idx = np.where(overlap.max(axis=1) > 0, overlap.argmax(axis=1), -1)
    if special_mask is not None:
        idx[np.asarray(special_mask, dtype=bool)] = -1
    return idx


def contextualised_segments(token_states: np.ndarray, segment_index: np.ndarray, n_segments: int) -> np.ndarray:
    """Mean of ``token_states`` over each segment's tokens (late chunking): the one span pooling of posfair.

    The audit's contextualised segments (tau) and the late-chunking retrieval strategy both use it.

    ``token_states``: (n_tokens, dim) final-layer states of one document;
    ``segment_index``: (n_tokens,) segment of each token or -1 (see
    :func:`token_segment_index`).  Returns (n_segments, dim).
    """
    states = np.asarray(token_states, dtype=np.float64)
    idx = np.asarray(segment_index)
    if len(idx) != len(states):
        raise ValueError(f"{len(states)} token states but {len(idx)} token-to-segment entries")
    out = np.zeros((n_segments, states.shape[1]), dtype=np.float64)
    for i in range(n_segments):
        mask = idx == i
        if not mask.any():
            raise ValueError(f"segment {i} has no tokens in the document (spans and tokenisation disagree)")
        out[i] = states[mask].mean(axis=0)
    return out


def added_token_count(tokenizer, prompt: str = "") -> int:
    """Tokens encoding a text whole adds to it: the special tokens (2 for BERT's [CLS] ... [SEP]) and ``prompt``
    in front (or the prompt a :class:`~posfair.encoding.PromptedTokenizer` puts there itself): what a document's
    token budget loses.  The one count of ``FairModel.special_token_count`` and the audit's segment windows."""
    whole = tokenizer(prompt + "x", add_special_tokens=True, verbose=False)["input_ids"]
    return len(whole) - len(tokenizer("x", add_special_tokens=False, verbose=False)["input_ids"])
