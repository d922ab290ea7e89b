"""Shards and the one shard function both executors run.

* :func:`plan_shards` cuts the distinct texts, in corpus order, into shards of
  ``shard_size``; a shard's id is a hash of its keys and its file is
  ``part-<id>.arrow`` (:func:`posfair.store.shard_path`), written atomically.
* :func:`process_shard` is the one shard function: encode in token-budget batches
  (:func:`posfair.encoding.encode_in_batches`), write.  The local executor
  (:mod:`posfair.distributed.job`) calls it in this process; the Ray executor
  (:mod:`posfair.distributed.ray_engine`) in an actor pool.  Same function, same
  batches, so both give bit-identical vectors.

Encoding is the encoding layer's (:mod:`posfair.encoding.passes`): the spec's calibration is a Calibration or
``posfair.STOCK`` (:attr:`~posfair.distributed.spec.EmbedSpec.calibration_obj`), never "whatever the model
carries".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posfair.distributed.spec import EmbedSpec
from posfair.encoding.passes import encode_in_batches
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


def encode_shard(model, spec: EmbedSpec, texts: Sequence[str]) -> tuple[np.ndarray, dict[str, int]]:
    """Pooled embeddings of a shard's texts (in order) and its token counts ``{"tokens", "padded"}``: the encoding
    layer's token-budget batches (:func:`posfair.encoding.encode_in_batches`) with the spec's settings."""
    return encode_in_batches(
        model,
        texts,
        spec.calibration_obj,
        prompt=spec.prompt,
        batching=spec.batching,
        max_batch_tokens=spec.max_batch_tokens,
        batch_size=spec.batch_size,
    )


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
