"""Shards and the one shard function both executors run.

* :func:`plan_shards` cuts the distinct texts, in corpus order, into shards of
  ``shard_size``; a shard's id is a hash of its keys and its file is
  ``part-<id>.arrow`` (:func:`posfair.store.shard_path`), written atomically.
* :func:`process_shard` is the one shard function: token lengths, length-aware
  batches (:mod:`posfair.distributed.batching`), encode, write.  The local executor
  (:mod:`posfair.distributed.job`) calls it in this process; the Ray executor
  (:mod:`posfair.distributed.ray_engine`) in an actor pool.  Same function, same
  batches, so both give bit-identical vectors.

Encoding goes through ``model.using(cal)`` and ``SentenceTransformer.encode`` with
the batches chosen here (``FairModel.encode`` would re-tokenise every batch for its
checks); the spec's calibration is a Calibration or ``posfair.STOCK``
(:attr:`~posfair.distributed.spec.EmbedSpec.calibration_obj`), never "whatever the model carries".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sentence_transformers import SentenceTransformer

from posfair._stack import user_stacklevel
from posfair.distributed.batching import length_aware_batches, padded_tokens
from posfair.distributed.spec import EmbedSpec
from posfair.model import FairModel, compat
from posfair.store import embedding_settings, run_settings, shard_path, text_key, write_shard

__all__ = ["Shard", "encode_shard", "plan_shards", "process_shard", "shard_id"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """A unit of work: distinct texts with their keys; ``id`` names its file ``part-<id>.arrow``."""

    id: str
    keys: tuple[str, ...]
    texts: tuple[str, ...]


def shard_id(keys: Iterable[str]) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode("ascii"))
        h.update(b"\n")
    return h.hexdigest()[:32]


def plan_shards(texts: Sequence[str], shard_size: int) -> list[Shard]:
    """Distinct texts in first-seen order, cut into shards of ``shard_size`` (a pure function of the corpus)."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1; got {shard_size}")
    unique: dict[str, str] = {}
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"text {i} is empty or not a string: posfair does not embed empty texts")
        unique.setdefault(text_key(t), t)
    keys, vals = list(unique), list(unique.values())
    return [
        Shard(shard_id(keys[i : i + shard_size]), tuple(keys[i : i + shard_size]), tuple(vals[i : i + shard_size]))
        for i in range(0, len(keys), shard_size)
    ]


def _batches_for(model: FairModel, spec: EmbedSpec, texts: Sequence[str]) -> tuple[list[np.ndarray], np.ndarray]:
    """The batches a shard is encoded in, and the (truncated) token length of each text."""
    full = [(spec.prompt or "") + t for t in texts]
    raw = model.token_lengths(full)
    limit = model.max_seq_length
    lengths = np.minimum(raw, limit) if limit else raw
    over = int((raw > lengths).sum())
    if over:
        warnings.warn(
            f"{over} of {len(texts)} texts are longer than max_seq_length={limit} tokens and are truncated",
            stacklevel=user_stacklevel(),
        )
    if spec.batching == "length":
        return length_aware_batches(lengths, spec.max_batch_tokens, spec.batch_size), lengths
    # sentence-transformers' own batching: sorted by character length, fixed size
    order = np.argsort([-len(t) for t in full], kind="stable")
    return [order[i : i + spec.batch_size] for i in range(0, len(order), spec.batch_size)], lengths


def _encode(model: FairModel, spec: EmbedSpec, texts: list[str], batch_size: int) -> np.ndarray:
    # as FairModel.encode(calibration=cal or STOCK), minus its per-call re-tokenising checks
    with model.using(spec.calibration_obj):
        out = SentenceTransformer.encode(
            model, texts, prompt=spec.prompt, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
        )
    return np.asarray(out, dtype=np.float32)


def encode_shard(model, spec: EmbedSpec, texts: Sequence[str]) -> tuple[np.ndarray, dict[str, int]]:
    """Pooled embeddings of a shard's texts (in order) and its token counts ``{"tokens", "padded"}``."""
    texts = list(texts)
    batches, lengths = _batches_for(model, spec, texts)
    if spec.batching == "fixed":
        vectors = _encode(model, spec, texts, spec.batch_size)
    else:
        vectors = np.zeros((len(texts), compat.embedding_dimension(model)), dtype=np.float32)
        for b in batches:
            vectors[b] = _encode(model, spec, [texts[i] for i in b], len(b))
    real, padded = padded_tokens(lengths, batches)
    return vectors, {"tokens": real, "padded": padded}


def process_shard(
    model, spec: EmbedSpec, ns_dir: str | os.PathLike, sid: str, keys: Sequence[str], texts: Sequence[str]
) -> dict[str, Any]:
    """Encode one shard and write ``part-<sid>.arrow`` atomically, unless that file exists already."""
    t0 = time.perf_counter()
    target = shard_path(ns_dir, sid)
    if target.exists():
        return {"shard": sid, "status": "skipped", "texts": 0, "tokens": 0, "padded": 0, "seconds": 0.0}
    vectors, counts = encode_shard(model, spec, texts)
    meta = json.loads((Path(ns_dir) / "meta.json").read_text(encoding="utf-8"))
    settings = run_settings(meta, **embedding_settings(model.fingerprint, spec.calibration_obj, spec.prompt))
    write_shard(ns_dir, list(keys), vectors, name=sid, settings=settings)
    return {"shard": sid, "status": "written", "texts": len(texts), **counts, "seconds": time.perf_counter() - t0}
