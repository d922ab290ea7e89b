"""Per-(document, position) measures: representation sigma and retention tau."""

from __future__ import annotations

import numpy as np

__all__ = ["normalize", "rowwise_cosine", "contextualised_segments"]


def normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """L2-normalise the last axis (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def rowwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``cos(a[i], b[i])`` for every row (broadcasting over leading axes)."""
    return np.sum(normalize(a) * normalize(b), axis=-1)


def contextualised_segments(token_states: np.ndarray, segment_index: np.ndarray, n_segments: int) -> np.ndarray:
    """Mean of ``token_states`` over each segment's tokens (late chunking).

    ``token_states``: (n_tokens, dim) final-layer states of one document;
    ``segment_index``: (n_tokens,) segment of each token or -1 (see
    :func:`posfair.fairness.documents.token_segment_index`).  Returns (n_segments, dim).
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
