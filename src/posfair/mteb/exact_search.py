"""MTEB's search over a posfair task's corpus, given to the model in MTEB's document format as it is.

MTEB's own search wrapper converts every corpus it encodes with a ``datasets`` map ("Standardizing text
corpus format": title and text joined and stripped), which draws a progress bar whatever
``show_progress_bar`` says.  A posfair task's corpus is plain texts (no titles), so :class:`DocumentSearch`
writes the converted rows itself (id, the text stripped as MTEB strips it, the body) and encodes them once per
subset into :class:`ExactIndex`, MTEB's index-backend protocol with its exact inner-product search: the
same rows reach the model, the same rankings come back, and nothing is drawn that the caller turned off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from datasets import Dataset
from mteb.models import EncoderProtocol, SearchEncoderWrapper, SearchProtocol
from mteb.types import PromptType
from torch.utils.data import DataLoader

#: the most similarity scores computed at once (queries x documents) in a full-corpus search
_SCORES_AT_ONCE = 1 << 24


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _collate(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {k: [r[k] for r in rows] for k in rows[0]}


def document_loader(corpus: Dataset, batch_size: int) -> DataLoader:
    """The corpus as MTEB's search hands documents to a model: rows ``id``, ``text`` (stripped) and ``body``
    (the text as given), in batches of ``batch_size`` -- built directly, without a ``datasets`` map."""
    texts = list(corpus["text"])
    rows = Dataset.from_dict({"id": list(corpus["id"]), "text": [t.strip() for t in texts], "body": texts})
    return DataLoader(rows, batch_size=batch_size, collate_fn=_collate, shuffle=False)


class ExactIndex:
    """MTEB's ``IndexEncoderSearchProtocol`` in memory: exact search with the model's similarity (the top
    ``top_k`` documents of the corpus, or of each query's candidates when MTEB reranks ``top_ranked``)."""

    def __init__(self) -> None:
        self.clear()

    def add_documents(self, embeddings: Any, idxs: list[str]) -> None:
        self._embeddings = _tensor(embeddings)
        self._position = {d: i for i, d in enumerate(idxs)}

    def search(
        self,
        embeddings: Any,
        top_k: int,
        similarity_fn: Any,
        top_ranked: dict[str, list[str]] | None = None,
        query_idx_to_id: dict[int, str] | None = None,
    ) -> tuple[list[list[float]], list[list[int]]]:
        queries = _tensor(embeddings)
        values: list[list[float]] = []
        indices: list[list[int]] = []
        if top_ranked is None:  # every document: positions in the corpus
            rows = max(1, _SCORES_AT_ONCE // max(1, len(self._embeddings)))
            for start in range(0, len(queries), rows):
                scores = torch.as_tensor(similarity_fn(queries[start : start + rows], self._embeddings))
                v, i = torch.topk(scores, min(top_k, scores.shape[1]), dim=1)
                values += v.tolist()
                indices += i.tolist()
            return values, indices
        if query_idx_to_id is None:
            raise ValueError("query_idx_to_id must be given to rerank top_ranked documents")
        for q in range(len(queries)):  # each query's candidates: positions in its candidate list
            candidates = top_ranked.get(query_idx_to_id[q]) or []
            if not candidates:
                values.append([])
                indices.append([])
                continue
            docs = self._embeddings[[self._position[d] for d in candidates]]
            scores = torch.as_tensor(similarity_fn(queries[q : q + 1], docs))
            v, i = torch.topk(scores, min(top_k, len(candidates)), dim=1)
            values.append(v[0].tolist())
            indices.append(i[0].tolist())
        return values, indices

    def clear(self) -> None:
        self._embeddings = torch.zeros((0, 0))
        self._position: dict[str, int] = {}


class DocumentSearch(SearchEncoderWrapper):
    """MTEB's search wrapper of an encoder, indexing a posfair corpus (columns ``id`` and ``text``) without
    MTEB's dataset conversion: see the module docs.  Any other corpus is indexed as MTEB indexes it."""

    def __init__(self, model: Any) -> None:
        super().__init__(model, index_backend=ExactIndex())

    def index(
        self,
        corpus: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        encode_kwargs: Any,
        num_proc: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(corpus, Dataset) or sorted(corpus.column_names) != ["id", "text"]:
            super().index(
                corpus,
                task_metadata=task_metadata,
                hf_split=hf_split,
                hf_subset=hf_subset,
                encode_kwargs=encode_kwargs,
                num_proc=num_proc,
                **kwargs,
            )
            return
        self.task_corpus = corpus
        embeddings = self.model.encode(
            document_loader(corpus, int(encode_kwargs.get("batch_size") or 32)),
            task_metadata=task_metadata,
            hf_split=hf_split,
            hf_subset=hf_subset,
            prompt_type=PromptType.document,
            **encode_kwargs,
        )
        self.index_backend.add_documents(embeddings, list(corpus["id"]))


def searcher(model: Any) -> Any:
    """What MTEB searches a posfair task with: an encoder MTEB would wrap in its own search wrapper gets
    :class:`DocumentSearch`; a search model or a cross-encoder is MTEB's business as it is."""
    if isinstance(model, EncoderProtocol) and not isinstance(model, SearchProtocol):
        return DocumentSearch(model)
    return model
