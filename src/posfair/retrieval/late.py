"""Late (contextual) chunking as a retrieval strategy, for any pooling.

Each passage is encoded once, stock, and the final-layer token states are pooled over
each chunk's span with the span pooling the audit uses for its contextualised segments
(:func:`posfair.model.token_spans.contextualised_segments`: the mean of the span's token states).
A document is scored by the maximum (``aggregate="max"``) or the mean (``"mean"``) of
the cosine similarities of the query to its chunks.

Chunks are either the semantic chunks of Segment Embed Average
(:meth:`~posfair.retrieval.sea.SegmentEmbedAverage.chunk_spans`, Chonkie's
``SemanticChunker``; ``chunks="semantic"``) or fixed windows of ``chunks`` content tokens
(an integer).  A chunk whose span lies beyond the model's token limit (a truncated passage)
or covers no token is dropped; :meth:`LateChunking.dropped` counts them and the evaluator
warns with the count (and records it with its result).

Late chunking was proposed for mean-pooled models, whose token states are trained to be
averaged.  For CLS and last-token models the token states were never trained to be pooled
this way: posfair pools them the same way (mean over the span) and lets the benchmark say
what that is worth.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posfair.calibration import STOCK
from posfair.encoding import encode_documents, model_tokenizer, span_key
from posfair.model.token_spans import contextualised_segments, token_segment_index
from posfair.retrieval.sea import SegmentEmbedAverage
from posfair.runtime.errors import PosfairInputError
from posfair.store import Namespace

__all__ = ["LateChunking", "AGGREGATES", "late_scores", "token_windows"]

AGGREGATES = ("max", "mean")


def token_windows(
    offsets: Sequence[tuple[int, int]], special_mask: Sequence[int], window: int
) -> list[tuple[int, int]]:
    """Character spans of consecutive windows of ``window`` content tokens (special tokens skipped)."""
    content = [tuple(o) for o, s in zip(offsets, special_mask, strict=True) if not s and o[1] > o[0]]
    return [
        (int(content[i][0]), int(content[min(i + window, len(content)) - 1][1])) for i in range(0, len(content), window)
    ]


@dataclass
class LateChunking:
    """Late chunking: chunk vectors pooled from one stock encoding of the whole passage.

    Args:
        aggregate: ``"max"`` or ``"mean"`` of the query's cosine to the document's chunks.
        chunks: ``"semantic"`` (SEA's semantic chunks) or a number of content tokens per window.
        sea: the chunker's settings for ``"semantic"`` (default :class:`SegmentEmbedAverage`).
        batch_size: encoder batch size.
        span_cache: chunk spans per passage, shared by the variants of :meth:`variants`
            (the semantic chunker runs once per passage for max and mean).
    """

    aggregate: str = "max"
    chunks: str | int = "semantic"
    sea: SegmentEmbedAverage | None = None
    batch_size: int = 16
    span_cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise PosfairInputError(
                f"late chunking aggregate must be one of {', '.join(AGGREGATES)}; got {self.aggregate!r}"
            )
        if isinstance(self.chunks, str) and self.chunks != "semantic":
            raise PosfairInputError(f"late chunks must be 'semantic' or a number of tokens; got {self.chunks!r}")
        if not isinstance(self.chunks, str) and (
            isinstance(self.chunks, bool) or int(self.chunks) != self.chunks or self.chunks < 1
        ):
            raise PosfairInputError(f"late chunk window must be a whole number of tokens >= 1; got {self.chunks!r}")
        if self.chunks == "semantic" and self.sea is None:
            self.sea = SegmentEmbedAverage(batch_size=self.batch_size)

    @classmethod
    def variants(cls, aggregates: Sequence[str], chunks: str | int = "semantic", **kwargs: Any) -> list[LateChunking]:
        """One strategy per aggregate, sharing the chunk spans (and the cached chunk vectors)."""
        cache: dict = {}
        sea = kwargs.pop("sea", None)
        if chunks == "semantic" and sea is None:
            sea = SegmentEmbedAverage(batch_size=kwargs.get("batch_size", 16))
        return [cls(aggregate=a, chunks=chunks, sea=sea, span_cache=cache, **kwargs) for a in dict.fromkeys(aggregates)]

    # -- names ---------------------------------------------------------------------------------
    @property
    def chunking(self) -> str:
        return "semantic chunks" if self.chunks == "semantic" else f"{int(self.chunks)}-token windows"

    @property
    def setting(self) -> str:
        """The setting's one name in results, tables and figures, e.g. ``late-max (semantic chunks)``."""
        return f"late-{self.aggregate} ({self.chunking})"

    def config(self) -> dict[str, Any]:
        """What changes the chunk vectors (the cache key; the aggregate is not part of it)."""
        return {
            "chunks": self.chunks if self.chunks == "semantic" else int(self.chunks),
            "sea": self.sea.config() if self.sea else None,
        }

    def key(self) -> str:
        return json.dumps({**self.config(), "aggregate": self.aggregate}, sort_keys=True)

    # -- chunks ---------------------------------------------------------------------------------
    def _tokenize(self, model: Any, texts: list[str]) -> dict:
        tok = model_tokenizer(model)
        return tok(
            texts,
            add_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            truncation=True,
            max_length=int(model.max_seq_length),
            verbose=False,
        )

    def spans(self, model: Any, texts: list[str]) -> list[list[tuple[int, int]]]:
        """The chunk spans of each text that hold at least one token within the model's limit."""
        todo = [t for t in dict.fromkeys(texts) if t not in self.span_cache]
        if todo:
            tok = self._tokenize(model, todo)
            raw = self.sea.chunk_spans(model, todo) if self.chunks == "semantic" else [None] * len(todo)
            for i, t in enumerate(todo):
                offsets, special = tok["offset_mapping"][i], tok["special_tokens_mask"][i]
                cand = raw[i] if raw[i] is not None else token_windows(offsets, special, int(self.chunks))
                idx = token_segment_index(offsets, cand, special) if cand else np.zeros(0, dtype=np.int64)
                kept = [sp for k, sp in enumerate(cand) if (idx == k).any()]
                dropped = len(cand) - len(kept)
                if not kept:  # no chunk covers a token (e.g. a text of special characters): one span over the text
                    kept = [(0, len(t))]
                self.span_cache[t] = (kept, dropped)
        return [self.span_cache[t][0] for t in texts]

    def dropped(self, model: Any, texts: Sequence[str]) -> int:
        """Chunks of the distinct ``texts`` dropped for lying beyond the token limit or covering no token."""
        texts = [t.strip() for t in texts]
        self.spans(model, texts)
        return sum(self.span_cache[t][1] for t in dict.fromkeys(texts))

    def _compute(self, model: Any, texts: list[str], spans: list[list[tuple[int, int]]]) -> list[np.ndarray]:
        """Chunk vectors (unnormalised span means of the final token states) per text, stock model."""
        _, tokens = encode_documents(model, texts, STOCK, batch_size=self.batch_size, with_tokens=True)
        tok = self._tokenize(model, texts)
        out = []
        for i, (ids, states) in enumerate(tokens):
            if list(ids) != list(tok["input_ids"][i]):
                raise PosfairInputError(
                    f"the model tokenised a passage differently from its tokenizer ({len(ids)} vs {len(tok['input_ids'][i])} tokens); "
                    "chunk spans cannot be mapped to token states"
                )
            idx = token_segment_index(tok["offset_mapping"][i], spans[i], tok["special_tokens_mask"][i])
            out.append(contextualised_segments(states, idx, len(spans[i])).astype(np.float32))
        return out

    def embed(
        self,
        model: Any,
        texts: list[str],
        store: Namespace | None = None,
        progress: Callable[[int], None] | None = None,
        chunk: int = 16,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(chunk vectors (C x dim, float32, unnormalised), owner (C,): the index into ``texts`` of each chunk).

        Each distinct text is encoded once, ``chunk`` texts at a time; ``store`` keeps every
        chunk vector under its (passage, span) key, so a rerun encodes only what is missing.
        """
        texts = [t.strip() for t in texts]  # sentence-transformers strips inputs: spans are on the stripped text
        if any(not t for t in texts):
            raise PosfairInputError("late chunking: an empty passage cannot be chunked")
        spans = self.spans(model, texts)
        span_of = dict(zip(texts, spans, strict=True))
        unique = list(span_of)
        vec_of: dict[str, np.ndarray] = {}
        for start in range(0, len(unique), chunk):
            part = unique[start : start + chunk]
            keys = {t: [span_key(t, sp) for sp in span_of[t]] for t in part}
            need = part if store is None else [t for t in part if store.missing(keys[t])]
            if need:
                vecs = self._compute(model, need, [span_of[t] for t in need])
                if store is not None:
                    store.put([k for t in need for k in keys[t]], np.concatenate(vecs))
                vec_of.update(zip(need, vecs, strict=True))
            for t in part:
                if t not in vec_of:
                    vec_of[t] = store.get(keys[t])
            if progress is not None:
                progress(len(part))
        owner = np.concatenate([np.full(len(span_of[t]), i, dtype=np.int64) for i, t in enumerate(texts)])
        return np.concatenate([vec_of[t] for t in texts]).astype(np.float32), owner


def late_scores(queries: np.ndarray, chunks: np.ndarray, owner: np.ndarray, n_docs: int, aggregate: str) -> np.ndarray:
    """(queries x n_docs) document scores: max or mean over each document's chunks of ``queries @ chunks.T``.

    ``queries`` and ``chunks`` are used as given (normalise them for cosines); ``owner`` must be
    sorted (chunks of a document contiguous) and every document must own at least one chunk.
    """
    owner = np.asarray(owner, dtype=np.int64)
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}; got {aggregate!r}")
    if len(owner) and (np.any(np.diff(owner) < 0)):
        raise ValueError("chunk owners must be sorted")
    counts = np.bincount(owner, minlength=n_docs)
    if len(counts) != n_docs or (counts == 0).any():
        raise ValueError("every document needs at least one chunk")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sims = np.asarray(queries, dtype=np.float32) @ np.asarray(chunks, dtype=np.float32).T
    if aggregate == "max":
        return np.maximum.reduceat(sims, starts, axis=1)
    return np.add.reduceat(sims, starts, axis=1) / counts
