"""The MTEB encoder with posfair's retrieval protocol (:func:`encoder`, :class:`PositionalEncoder`).

Documents are encoded with the setting under test (stock or a
:class:`~posfair.Calibration`), queries always with the stock model, each with the
prompt MTEB's own SentenceTransformer wrapper would pick; every embedding is
L2-normalised and scored by inner product (cosine), as
:class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` does, so MTEB's
per-group nDCG@10 equals posfair's.  The document setting is recorded in the model's
``experiment_kwargs``, so MTEB's result cache stores stock and calibrated runs apart
(see the package docs, :mod:`posfair.mteb`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mteb.models import SentenceTransformerEncoderWrapper
from mteb.models.abs_encoder import get_prompt
from mteb.types import PromptType
from sentence_transformers import SentenceTransformer

from posfair.calibration import Calibration
from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice, Resolved, check_choice
from posfair.calibration.coverage import CalibrationFallbackWarning, quiet_fallback
from posfair.encoding import embed_through, l2_normalize, resolved_calibration
from posfair.encoding import encoder as posfair_encoder
from posfair.model import compat, model_fingerprint
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import EmbeddingStore, embedding_namespace


def _document_calibration(model: Any, calibration: CalibrationChoice) -> Resolved:
    try:
        check_choice(calibration)
    except TypeError as exc:
        raise PosfairInputError(str(exc)) from None
    if isinstance(calibration, Calibration) and not callable(getattr(model, "using", None)):
        raise PosfairInputError(
            f"{type(model).__name__} cannot calibrate: load the model with posfair.load_model() to encode with {calibration.label()}"
        )
    resolved = resolved_calibration(model, calibration)
    if resolved is not STOCK:
        with model.using(resolved):  # refuses a calibration this model cannot take (e.g. layers out of range)
            pass
    return resolved


class PositionalEncoder(SentenceTransformerEncoderWrapper):
    """MTEB's SentenceTransformer wrapper with posfair's retrieval protocol (see :func:`encoder`)."""

    def __init__(
        self,
        model: SentenceTransformer,
        calibration: CalibrationChoice = MODEL_DEFAULT,
        *,
        store: EmbeddingStore | str | Path | None = None,
        chunk_size: int = 256,
    ):
        if not isinstance(model, SentenceTransformer):
            raise PosfairInputError(
                f"model must be a sentence-transformers model (posfair.load_model()); got {type(model).__name__}"
            )
        if chunk_size < 1:
            raise PosfairInputError(f"chunk_size must be at least 1; got {chunk_size}")
        self.calibration = _document_calibration(model, calibration)
        super().__init__(model)
        self.store = EmbeddingStore(store) if isinstance(store, (str, Path)) else store
        self.chunk_size = chunk_size
        self._memo: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._documents = 0  # distinct documents encoded with the calibration, and how many of them it changed
        self._calibrated = 0
        # MTEB stores results per model name, revision and experiment_kwargs: name what this wrapper encodes
        cal = self.calibration
        experiment = {
            **(self.mteb_model_meta.experiment_kwargs or {}),
            "posfair_documents": cal.label(),
            "posfair_queries": STOCK.label(),
            "posfair_max_seq_length": int(model.max_seq_length),
        }
        if cal is not STOCK:
            experiment["posfair_calibration"] = cal.key()
        self.mteb_model_meta = self.mteb_model_meta.model_copy(update={"experiment_kwargs": experiment})

    @property
    def calibrated_share(self) -> float | None:
        """Fraction of the distinct documents encoded so far that the calibration changed (None: stock)."""
        if self.calibration is STOCK or self._documents == 0:
            return None
        return self._calibrated / self._documents

    def _prompt(self, task_metadata: Any, prompt_type: PromptType | None) -> str | None:
        """The prompt MTEB's own SentenceTransformer wrapper would use (task-specific first, then by type),
        with sentence-transformers' fallbacks of ``encode_query`` / ``encode_document``."""
        prompt = get_prompt(self.model_prompts, task_metadata, prompt_type)
        if prompt is None and prompt_type is not None:
            names = ("query",) if prompt_type == PromptType.query else ("document", "passage", "corpus")
            prompts = getattr(self.model, "prompts", None) or {}
            prompt = next((prompts[n] for n in names if n in prompts), None)
        return prompt or None

    def _embed(
        self, texts: list[str], calibration: Resolved, prompt: str | None, batch_size: int, where: str
    ) -> np.ndarray:
        compute = posfair_encoder(self.model, calibration, prompt=prompt, batch_size=batch_size)
        computed: list[str] = []

        def run(batch: list[str]) -> np.ndarray:
            computed.extend(batch)
            with quiet_fallback():  # reported once per call below, with the counts
                return compute(batch)

        if self.store is not None:  # the namespaces posfair's evaluator uses: the two share their embeddings
            ns = embedding_namespace(self.store, model_fingerprint(self.model), calibration, prompt)
            vectors = embed_through(texts, ns, run, chunk_size=self.chunk_size)
        else:
            memo = self._memo.setdefault((calibration.key(), prompt or ""), {})
            missing = list(dict.fromkeys(t for t in texts if t not in memo))
            if missing:
                memo.update(zip(missing, embed_through(missing, None, run, chunk_size=self.chunk_size), strict=True))
            vectors = (
                np.stack([memo[t] for t in texts])
                if texts
                else np.zeros((0, compat.embedding_dimension(self.model) or 0), np.float32)
            )
        if calibration is not STOCK and computed:
            cov = self.model.calibration_coverage(computed, calibration, prompt=prompt)
            self._documents += cov.total
            self._calibrated += cov.calibrated
            msg = cov.message()
            if msg:
                warnings.warn(
                    f"MTEB task {where}, documents: {msg}", CalibrationFallbackWarning, stacklevel=user_stacklevel()
                )
        return vectors

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """L2-normalised embeddings of MTEB's texts: documents (``prompt_type`` document) with the
        calibration, everything else with the stock model; each distinct text is encoded once per
        wrapper (or once per ``store``)."""
        unknown = sorted(set(kwargs) - {"batch_size", "show_progress_bar"})
        if unknown:
            raise PosfairInputError(
                f"posfair's MTEB encoder takes batch_size and show_progress_bar from encode_kwargs; got {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
            )
        texts: list[str] = []
        for batch in inputs:
            if "text" not in batch:
                raise PosfairInputError(
                    f"posfair encodes texts only; MTEB task {task_metadata.name} gives {sorted(batch)}"
                )
            texts.extend(batch["text"])
        calibration = self.calibration if prompt_type == PromptType.document else STOCK
        prompt = self._prompt(task_metadata, prompt_type)
        vectors = self._embed(texts, calibration, prompt, int(kwargs.get("batch_size") or 32), task_metadata.name)
        return l2_normalize(np.asarray(vectors, dtype=np.float32))

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity (inner product of L2-normalised vectors), posfair's search score, whatever
        similarity function the model declares."""
        a = torch.nn.functional.normalize(
            torch.atleast_2d(torch.as_tensor(np.asarray(embeddings1), dtype=torch.float32)), dim=-1
        )
        b = torch.nn.functional.normalize(
            torch.atleast_2d(torch.as_tensor(np.asarray(embeddings2), dtype=torch.float32)), dim=-1
        )
        return a @ b.T


def encoder(
    model: SentenceTransformer,
    calibration: CalibrationChoice = MODEL_DEFAULT,
    *,
    store: EmbeddingStore | str | Path | None = None,
) -> PositionalEncoder:
    """Wrap ``model`` for ``mteb.evaluate`` with posfair's retrieval protocol.

    Documents (MTEB's ``prompt_type`` document) are encoded with ``calibration``, queries
    and every other text with the stock model, each with the prompt MTEB's own
    SentenceTransformer wrapper picks from ``model.prompts`` (a task-specific prompt
    first, then ``"query"`` / ``"document"``, then sentence-transformers' ``"passage"`` /
    ``"corpus"``).  Embeddings are L2-normalised and scored by inner product, so the
    ranking is posfair's exact cosine search.  With the same prompts (e.g.
    ``PositionalRetrievalEvaluator(bench, cal, query_prompt_name="query")`` for a model
    with a ``"query"`` prompt) MTEB's nDCG@10 per group equals posfair's.

    Passing a calibrated :class:`~posfair.FairModel` to ``mteb.evaluate`` directly gives
    the same numbers on posfair's tasks (they use this wrapper for it), but MTEB's result
    cache then cannot tell it from the stock model (see the package docs, :mod:`posfair.mteb`); this wrapper
    records the setting in ``mteb_model_meta.experiment_kwargs``.

    Args:
        model: a :class:`~posfair.FairModel` (any SentenceTransformer for stock runs).
        calibration: ``posfair.MODEL_DEFAULT`` (default): the model's own calibration (stock if it
            has none); ``posfair.STOCK``; or a :class:`~posfair.Calibration`.
        store: an :class:`~posfair.store.EmbeddingStore` (or folder) to cache embeddings
            in, shared with posfair's evaluator; without one each distinct text is encoded
            once per wrapper (MTEB asks for the corpus once per subset).

    Calibrated encodings warn once per MTEB call with the documents encoded stock
    (shorter than one basket); ``calibrated_share`` gives the fraction changed so far.
    """
    return PositionalEncoder(model, calibration, store=store)
