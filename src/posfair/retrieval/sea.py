"""Segment Embed Average (SEA): the position-agnostic baseline of Michail et al. (2026).

Each passage is split by semantic chunking (Chonkie's ``SemanticChunker``, the
library the paper cites), every chunk is embedded alone with the stock model
(no calibration) and the passage embedding is the mean of its chunk embeddings
(L2-normalised before averaging by default; the mean is re-normalised at search
time like every embedding).

The chunker needs an embedding model of its own to find topic shifts.  Chonkie's
default is the hub model ``minishlab/potion-base-32M``; pass that name (or any
Chonkie ``BaseEmbeddings``) as ``chunker_model`` to use it.  The default here,
``None``, wraps the evaluated model itself in Chonkie's
``SentenceTransformerEmbeddings``, which works offline.  ``chunk_size`` (tokens)
defaults to the model's ``max_seq_length`` so that no chunk is truncated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posfair.calibration import STOCK
from posfair.encoding import embed_through, encoder
from posfair.store import Namespace

__all__ = ["SegmentEmbedAverage"]


def _stock_embeddings(base: type, model: Any) -> Any:
    """Chonkie's SentenceTransformerEmbeddings over ``model``, always encoding with the stock model."""
    encode = encoder(model, STOCK)

    class _StockEmbeddings(base):
        def embed(self, text: str) -> np.ndarray:
            return encode([text])[0]

        def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
            return encode(texts)

    return _StockEmbeddings(model)


@dataclass
class SegmentEmbedAverage:
    """Semantic chunking + per-chunk embedding + mean.

    Fields mirror ``chonkie.SemanticChunker`` (defaults are Chonkie's, except
    ``chunk_size``, see the module docstring).
    """

    chunker_model: Any = None
    threshold: float = 0.8
    chunk_size: int | None = None
    similarity_window: int = 3
    min_sentences_per_chunk: int = 1
    min_characters_per_sentence: int = 24
    normalize_chunks: bool = True
    batch_size: int = 32
    _chunkers: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def config(self) -> dict[str, Any]:
        """Everything that changes the output (used in cache keys)."""
        cm = self.chunker_model
        return {
            "chunker_model": "self"
            if cm is None
            else (cm if isinstance(cm, str) else type(cm).__name__ + ":" + repr(cm)),
            "threshold": self.threshold,
            "chunk_size": self.chunk_size,
            "similarity_window": self.similarity_window,
            "min_sentences_per_chunk": self.min_sentences_per_chunk,
            "min_characters_per_sentence": self.min_characters_per_sentence,
            "normalize_chunks": self.normalize_chunks,
        }

    def _chunker(self, model: Any):
        key = id(model)
        if key not in self._chunkers:
            try:
                from chonkie import SemanticChunker
                from chonkie.embeddings import SentenceTransformerEmbeddings
            except ImportError as e:
                raise ImportError("Segment Embed Average needs chonkie: `pip install chonkie`") from e
            emb = (
                self.chunker_model
                if self.chunker_model is not None
                else _stock_embeddings(SentenceTransformerEmbeddings, model)
            )
            size = self.chunk_size or int(getattr(model, "max_seq_length", None) or 512)
            self._chunkers[key] = SemanticChunker(
                embedding_model=emb,
                threshold=self.threshold,
                chunk_size=size,
                similarity_window=self.similarity_window,
                min_sentences_per_chunk=self.min_sentences_per_chunk,
                min_characters_per_sentence=self.min_characters_per_sentence,
            )
        return self._chunkers[key]

    def chunk(self, model: Any, texts: list[str]) -> list[list[str]]:
        """Semantic chunks of each text (a text the chunker leaves empty is one chunk)."""
        chunker = self._chunker(model)
        out = []
        for t in texts:
            chunks = [c.text for c in chunker.chunk(t) if c.text.strip()]
            out.append(chunks or [t])
        return out

    def chunk_spans(self, model: Any, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Character spans ``[start, end)`` of the semantic chunks of each text (the chunks of :meth:`chunk`;
        a text the chunker leaves empty is one span over the whole text)."""
        chunker = self._chunker(model)
        out = []
        for t in texts:
            spans = [(int(c.start_index), int(c.end_index)) for c in chunker.chunk(t) if c.text.strip()]
            out.append(spans or [(0, len(t))])
        return out

    def embed(
        self,
        model: Any,
        texts: list[str],
        chunk_store: Namespace | None = None,
        encode: Callable[[list[str]], np.ndarray] | None = None,
    ) -> np.ndarray:
        """SEA embeddings of ``texts`` (n x d, float32).

        ``encode`` embeds a list of chunk texts with the stock model (default: the
        encoding layer's stock :func:`~posfair.encoding.encoder`, normalised when
        ``normalize_chunks``); ``chunk_store`` caches the chunk embeddings (each distinct
        chunk is embedded once, with or without it).
        """
        if encode is None:
            encode = encoder(model, STOCK, batch_size=self.batch_size, normalize_embeddings=self.normalize_chunks)
        chunks = self.chunk(model, texts)
        flat = [c for cs in chunks for c in cs]
        vecs = embed_through(flat, chunk_store, encode, chunk_size=max(256, self.batch_size))
        out, start = [], 0
        for cs in chunks:
            out.append(vecs[start : start + len(cs)].mean(axis=0))
            start += len(cs)
        return np.stack(out).astype(np.float32)
