"""Corpus-scale embedding jobs: deterministic shards, two executors, resumable, guarded by a manifest.

A job embeds every distinct text of a corpus with one model, calibration and
prompt, and writes the vectors into the *same* namespace of an
:class:`~posfair.store.EmbeddingStore` that :func:`~posfair.encoding.encode_cached`
(and so the audit, the retrieval evaluation, sweeps and ``posfair encode``)
reads: keys are :func:`~posfair.store.text_key` of the text, vectors are the
pooled embeddings exactly as the model returns them.  Point any of those at the
same cache folder and they find everything already computed.

* The distinct texts are cut into shards (:func:`~posfair.distributed.worker.plan_shards`);
  a shard whose file exists (or whose texts are all in the store already) is
  skipped, so reruns are idempotent and a killed run -- a worker or the driver --
  loses only the shards in flight.
* Each shard goes through the one shard function
  (:func:`~posfair.distributed.worker.process_shard`), in this process (``engine="local"``)
  or on a Ray actor pool (``engine="ray"``, :mod:`posfair.distributed.ray_engine`):
  same function, same batches, bit-identical vectors.
* ``manifest.json`` in the namespace records model, fingerprint, calibration,
  prompt, text field, corpus fingerprints (:mod:`posfair.distributed.corpus_record`),
  posfair version and a hash of the code that computes embeddings; a run whose
  settings disagree is refused (:class:`~posfair.store.ManifestMismatch`), and so is a namespace
  holding a shard made with other settings.  The check is
  :func:`posfair.store.scan_namespace`, the same one every other command runs on
  the store; it verifies each shard's checksum, sets damaged shards aside (renamed
  ``part-<id>.arrow.damaged-<n>``, with a warning) so that this run recomputes them,
  and rebuilds a missing manifest from the shards' own metadata.

Progress: ``progress(n)`` callbacks and ``logging.getLogger("posfair.distributed.job")``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from posfair.calibration import STOCK
from posfair.calibration.coverage import CalibrationFallbackWarning
from posfair.corpus.texts import read_corpus_texts as read_corpus_texts
from posfair.distributed.corpus_record import corpus_fingerprint, record_corpus
from posfair.distributed.ray_engine import RAY_INSTALL_HINT as RAY_INSTALL_HINT
from posfair.distributed.ray_engine import ray_available as ray_available
from posfair.distributed.ray_engine import require_ray, run_ray
from posfair.distributed.spec import EmbedSpec
from posfair.distributed.worker import Shard, plan_shards, process_shard
from posfair.model import FairModel, compat
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import (
    EmbeddingStore,
    embedding_meta,
    embedding_settings,
    run_settings,
    scan_namespace,
    shard_path,
    write_manifest,
)
from posfair.store import ManifestMismatch as ManifestMismatch

__all__ = ["EmbedReport", "embed_texts"]
# The ``name as name`` imports above re-export what ``posfair embed`` imported from this module
# before the split (read_corpus_texts, RAY_INSTALL_HINT, ray_available, ManifestMismatch); new
# code imports them from ``posfair.distributed``.

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EmbedReport:
    """What a job did; ``texts_per_second`` counts texts encoded in this run over its wall time."""

    namespace: str
    engine: str
    workers: int
    shards: int
    written: int
    skipped: int
    texts: int
    encoded: int
    tokens: int
    padded: int
    seconds: float
    #: fraction of the corpus's distinct texts the calibration changes (None for a stock job);
    #: texts of at most one basket are encoded stock (see posfair.calibration.coverage)
    calibrated_share: float | None = None

    @property
    def texts_per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else 0.0

    @property
    def padding_waste(self) -> float:
        return (self.padded - self.tokens) / self.tokens if self.tokens else 0.0


def _run_local(model, spec: EmbedSpec, ns_dir: Path, shards: list[Shard], on_result, after_shard) -> int:
    for s in shards:
        res = process_shard(model, spec, ns_dir, s.id, s.keys, s.texts)
        logger.debug("shard %s: %s, %d texts in %.2fs", res["shard"], res["status"], res["texts"], res["seconds"])
        if after_shard is not None:
            after_shard(res)
        on_result(res)
    return 1


def embed_texts(
    texts: Sequence[str],
    store_root: str | os.PathLike,
    spec: EmbedSpec,
    *,
    model: FairModel | None = None,
    shard_size: int = 1024,
    engine: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    corpus_source: str = "texts",
    text_field: str = "text",
    add_corpus: bool = False,
    progress: Callable[[int], None] | None = None,
    after_shard: Callable[[dict], None] | None = None,
) -> EmbedReport:
    """Embed the distinct ``texts`` into the embedding namespace of ``store_root``; resumable.

    ``engine="local"`` runs the shards in this process; ``engine="ray"`` on a Ray
    actor pool (``ray_address``: None = a local instance, or "auto" / "ray://..."
    for a cluster; ``workers``: replicas, default one per GPU, else one per CPU).
    On a cluster ``store_root`` must be a path every node sees (a shared file
    system): workers write their shards there directly; the driver holds the
    corpus's texts and hands them to Ray shard by shard.
    ``model``: the driver's loaded encoder (loaded from ``spec`` when None; the
    local engine encodes with it).  ``progress(n)`` gets the number of texts of
    every finished (or skipped) shard.  ``after_shard(result)`` runs after each
    shard where it ran (in the worker for Ray).  Raises :class:`~posfair.store.ManifestMismatch`
    when the store holds shards of other settings or another corpus (unless
    ``add_corpus``), before any work.
    """
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray'; got {engine!r}")
    if engine == "ray":
        require_ray()
    t0 = time.perf_counter()
    if model is None:  # on Ray the driver only needs the fingerprint and dimension: keep it off the GPUs
        model = spec.load_model("cpu" if engine == "ray" else None)
    cal = spec.calibration_obj
    shards = plan_shards(texts, shard_size)
    all_keys = [k for s in shards for k in s.keys]
    ns_dir, present = _open_namespace(model, spec, cal, store_root, all_keys, corpus_source, text_field, add_corpus)
    share = _calibrated_share(model, spec, cal, shards)
    todo, skipped = _shards_to_encode(shards, ns_dir, present)
    logger.info(
        "%d distinct texts in %d shards: %d to encode (%s engine), %d already in %s",
        len(all_keys),
        len(shards),
        len(todo),
        engine,
        skipped,
        ns_dir,
    )
    if progress is not None:
        progress(len(all_keys) - sum(len(s.keys) for s in todo))
    tally = _Tally(skipped, todo, progress)
    n = 1
    if todo:
        if engine == "local":
            n = _run_local(model, spec, ns_dir, todo, tally, after_shard)
        else:
            n = run_ray(spec, ns_dir, todo, tally, after_shard, model.fingerprint, ray_address, workers)
    return tally.report(
        namespace=str(ns_dir),
        engine=engine,
        workers=n,
        shards=len(shards),
        texts=len(all_keys),
        seconds=time.perf_counter() - t0,
        calibrated_share=share,
    )


def _open_namespace(
    model: FairModel,
    spec: EmbedSpec,
    cal,
    store_root: str | os.PathLike,
    all_keys: list[str],
    corpus_source: str,
    text_field: str,
    add_corpus: bool,
) -> tuple[Path, set[str]]:
    """The job's namespace folder, checked against the job's settings and corpus (ManifestMismatch before any work;
    damaged shards set aside), its manifest written, and which of ``all_keys`` it holds already."""
    dim = compat.embedding_dimension(model)
    meta = embedding_meta(model.fingerprint, cal, spec.prompt)
    ns_dir = EmbeddingStore(store_root).namespace_dir(**meta)
    settings = run_settings(
        meta,
        **embedding_settings(model.fingerprint, cal, spec.prompt, dim=dim, text_field=text_field),
        model=spec.model or "bundled",
    )
    corpus = {"fingerprint": corpus_fingerprint(all_keys), "source": corpus_source, "texts": len(all_keys)}
    # settings check, shards checked (damaged ones set aside: their keys are missing below), key index loaded
    manifest, stored = scan_namespace(ns_dir, settings, write=False)
    found, _ = stored.locate(all_keys)
    present = {k for k, s in zip(all_keys, found, strict=True) if s >= 0}
    manifest = record_corpus(ns_dir, manifest, corpus, len(present) == len(all_keys), add_corpus)
    write_manifest(ns_dir, manifest)
    return ns_dir, present


def _calibrated_share(model: FairModel, spec: EmbedSpec, cal, shards: list[Shard]) -> float | None:
    """The share of the corpus's texts ``cal`` changes (None for a stock job), counted once for the corpus (token
    lengths only), not per shard; one warning when it is not all of them."""
    if cal is STOCK:
        return None
    coverage = model.calibration_coverage([t for s in shards for t in s.texts], cal, prompt=spec.prompt)
    if coverage.message() is not None:
        warnings.warn(f"posfair embed: {coverage.message()}", CalibrationFallbackWarning, stacklevel=user_stacklevel())
    return coverage.share


def _shards_to_encode(shards: list[Shard], ns_dir: Path, present: set[str]) -> tuple[list[Shard], int]:
    """The shards left to encode, each cut to its texts not in the store yet, and how many shards are skipped (their
    file exists, or the store holds all their texts)."""
    todo: list[Shard] = []
    skipped = 0
    for s in shards:
        if shard_path(ns_dir, s.id).exists():
            skipped += 1
            continue
        missing = [i for i, k in enumerate(s.keys) if k not in present]
        if not missing:
            skipped += 1
            continue
        todo.append(Shard(s.id, tuple(s.keys[i] for i in missing), tuple(s.texts[i] for i in missing)))
    return todo, skipped


class _Tally:
    """The shard results as they come in (the ``on_result`` of both executors): shards written and skipped, texts,
    tokens and padded tokens encoded; ``progress`` gets each finished shard's number of texts."""

    def __init__(self, skipped: int, todo: list[Shard], progress: Callable[[int], None] | None):
        self.totals = {"written": 0, "skipped": skipped, "texts": 0, "tokens": 0, "padded": 0}
        self.sizes = {s.id: len(s.keys) for s in todo}
        self.progress = progress

    def __call__(self, res: dict) -> None:
        self.totals[str(res["status"])] += 1
        for k in ("texts", "tokens", "padded"):
            self.totals[k] += int(res[k])
        if self.progress is not None:
            self.progress(self.sizes[str(res["shard"])])

    def report(self, **job) -> EmbedReport:
        """The job's report: ``job`` (namespace, engine, workers, shards, texts, seconds, calibrated_share) and the
        counts tallied."""
        t = self.totals
        return EmbedReport(
            **job,
            written=t["written"],
            skipped=t["skipped"],
            encoded=t["texts"],
            tokens=t["tokens"],
            padded=t["padded"],
        )
