"""Corpus-scale embedding jobs: deterministic shards, two executors, resumable, guarded by a manifest.

A job embeds every distinct text of a corpus with one model, calibration and
prompt, and writes the vectors into the *same* namespace of an
:class:`~posfair.store.EmbeddingStore` that :func:`~posfair.store.encode_cached`
(and so the audit, the retrieval evaluation, sweeps and ``posfair encode``)
reads: keys are :func:`~posfair.store.text_key` of the text, vectors are the
pooled embeddings exactly as the model returns them.  Point any of those at the
same cache folder and they find everything already computed.

* :func:`plan_shards` cuts the distinct texts, in corpus order, into shards of
  ``shard_size``; a shard's id is a hash of its keys and its file is
  ``part-<id>.npz``, written atomically.  A shard whose file exists (or whose
  texts are all in the store already) is skipped, so reruns are idempotent and a
  killed run -- a worker or the driver -- loses only the shards in flight.
* :func:`process_shard` is the one shard function: token lengths, length-aware
  batches (:mod:`posfair.distributed.batching`), encode, write.  The local
  executor calls it in this process; the Ray executor calls it in an actor pool
  (one model replica per GPU, or per group of CPUs).  Same function, same
  batches, so both give bit-identical vectors.
* ``manifest.json`` in the namespace records model, fingerprint, calibration,
  prompt, text field, corpus fingerprints, posfair version and a hash of the code
  that computes embeddings; a run whose settings disagree is refused
  (:class:`ManifestMismatch`), and so is a namespace holding a shard made with
  other settings.  The check is :func:`posfair.store.open_namespace_dir`, the same
  one every other command runs on the store; it verifies each shard's checksum,
  sets damaged shards aside (renamed ``part-<id>.npz.damaged-<n>``, with a
  warning) so that this run recomputes them, and rebuilds a missing manifest
  from the shards' own metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posfair.calibration.coverage import CalibrationFallbackWarning
from posfair.distributed.batching import length_aware_batches, padded_tokens
from posfair.io import atomic_write_json, check_texts
from posfair.store import (
    MANIFEST,
    EmbeddingStore,
    ManifestMismatch,
    code_version,
    embedding_meta,
    embedding_settings,
    open_namespace_dir,
    run_settings,
    text_key,
    write_shard,
)

__all__ = [
    "EmbedSpec",
    "Shard",
    "EmbedReport",
    "ManifestMismatch",
    "RAY_INSTALL_HINT",
    "code_version",
    "corpus_fingerprint",
    "embed_texts",
    "plan_shards",
    "process_shard",
    "ray_available",
    "read_corpus_texts",
]

RAY_INSTALL_HINT = "pip install 'posfair[ray]'"

# ------------------------------------------------------------------------------------------
# settings


@dataclasses.dataclass(frozen=True)
class EmbedSpec:
    """Everything a worker needs to rebuild the encoder and batch a shard (JSON-serialisable).

    ``batching="length"`` sorts a shard by token length and cuts batches of at most
    ``max_tokens`` padded tokens and ``batch_size`` texts; ``batching="fixed"``
    hands each shard to ``model.encode(batch_size=batch_size)`` unchanged, which is
    exactly what :func:`~posfair.store.encode_cached` does with one chunk (bit-identical
    vectors when shards equal its chunks).
    """

    model: str | None = None
    calibration: dict | None = None
    prompt: str | None = None
    pooling: str | None = None
    padding_side: str | None = None
    max_seq_length: int | None = None
    trust_remote_code: bool = False
    device: str | None = None
    batching: str = "length"
    batch_size: int = 32
    max_tokens: int = 16384

    def __post_init__(self) -> None:
        if self.batching not in ("length", "fixed"):
            raise ValueError(f"batching must be 'length' or 'fixed'; got {self.batching!r}")
        if self.batch_size < 1 or self.max_tokens < 1:
            raise ValueError(f"batch_size and max_tokens must be >= 1; got {self.batch_size}, {self.max_tokens}")

    @property
    def calibration_obj(self):
        from posfair.calibration import Calibration

        return Calibration.from_dict(self.calibration) if self.calibration else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmbedSpec:
        return cls(**d)

    def load_model(self, device: str | None = None):
        """Load the encoder (on ``device``, default ``self.device``) and validate the calibration on it."""
        from posfair.model import load_model

        model = load_model(
            None if self.model in (None, "", "bundled") else self.model, device=device or self.device,
            trust_remote_code=self.trust_remote_code, pooling=self.pooling, padding_side=self.padding_side,
            max_seq_length=self.max_seq_length,
        )  # fmt: skip
        model.eval()
        cal = self.calibration_obj
        if cal is not None:
            model.transformer_module.resolve(cal)
        return model


@dataclasses.dataclass(frozen=True)
class Shard:
    """A unit of work: distinct texts with their keys; ``id`` names its file ``part-<id>.npz``."""

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


def corpus_fingerprint(keys: Iterable[str]) -> str:
    """Content identity of a corpus: a hash of its sorted distinct text keys (order-independent)."""
    h = hashlib.sha256()
    for k in sorted(set(keys)):
        h.update(k.encode("ascii"))
    return h.hexdigest()[:24]


# ------------------------------------------------------------------------------------------
# the shard function


def _batches_for(model, spec: EmbedSpec, texts: Sequence[str]) -> tuple[list[np.ndarray], np.ndarray]:
    """The batches a shard is encoded in, and the (truncated) token length of each text."""
    full = [(spec.prompt or "") + t for t in texts]
    raw = model.token_lengths(full)
    limit = model.max_seq_length
    lengths = np.minimum(raw, limit) if limit else raw
    over = int((raw > lengths).sum())
    if over:
        warnings.warn(f"{over} of {len(texts)} texts are longer than max_seq_length={limit} tokens and are truncated", stacklevel=3)
    if spec.batching == "length":
        return length_aware_batches(lengths, spec.max_tokens, spec.batch_size), lengths
    # sentence-transformers' own batching: sorted by character length, fixed size
    order = np.argsort([-len(t) for t in full], kind="stable")
    return [order[i : i + spec.batch_size] for i in range(0, len(order), spec.batch_size)], lengths


def _encode(model, spec: EmbedSpec, texts: list[str], batch_size: int) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    cal = spec.calibration_obj
    with model.using(cal):  # as FairModel.encode(calibration=cal or False), minus its per-call re-tokenising checks
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
        from posfair import compat  # sentence-transformers 5.x / 6.x name the dimension differently

        vectors = np.zeros((len(texts), compat.embedding_dimension(model)), dtype=np.float32)
        for b in batches:
            vectors[b] = _encode(model, spec, [texts[i] for i in b], len(b))
    real, padded = padded_tokens(lengths, batches)
    return vectors, {"tokens": real, "padded": padded}


def process_shard(model, spec: EmbedSpec, ns_dir: str | os.PathLike, sid: str, keys: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
    """Encode one shard and write ``part-<sid>.npz`` atomically, unless that file exists already."""
    t0 = time.perf_counter()
    target = Path(ns_dir) / f"part-{sid}.npz"
    if target.exists():
        return {"shard": sid, "status": "skipped", "texts": 0, "tokens": 0, "padded": 0, "seconds": 0.0}
    vectors, counts = encode_shard(model, spec, texts)
    meta = json.loads((Path(ns_dir) / "meta.json").read_text(encoding="utf-8"))
    settings = run_settings(meta, **embedding_settings(model.fingerprint, spec.calibration_obj, spec.prompt))
    write_shard(ns_dir, list(keys), vectors, name=sid, settings=settings)
    return {"shard": sid, "status": "written", "texts": len(texts), **counts, "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------
# store side: existing shards, manifest


def _add_corpus(ns_dir: Path, manifest: dict[str, Any], corpus: dict[str, Any], covered: bool, add_corpus: bool) -> dict[str, Any]:
    """The manifest with this run's corpus recorded; raises ManifestMismatch for another corpus.

    ``covered``: every text of this corpus is in the store already (nothing would be
    written).  A manifest without corpora (made by another command, or rebuilt from
    the shards) takes this one.
    """
    corpora = list(manifest.get("corpora") or [])
    if all(c.get("fingerprint") != corpus["fingerprint"] for c in corpora) and (not covered or not corpora):
        if corpora and not add_corpus:
            known = ", ".join(f"{c.get('fingerprint')} ({c.get('source')}, {c.get('texts')} texts)" for c in corpora)
            raise ManifestMismatch(
                f"{ns_dir} was built from another corpus ({known}); this corpus is {corpus['fingerprint']} "
                f"({corpus['source']}, {corpus['texts']} texts). Pass --add-corpus (add_corpus=True) to add it to the "
                "same store, or use another --out"
            )
        corpora.append(corpus)
    return {**manifest, "corpora": corpora}


# ------------------------------------------------------------------------------------------
# the job


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


def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _run_local(model, spec: EmbedSpec, ns_dir: Path, shards: list[Shard], on_result, after_shard) -> int:
    for s in shards:
        res = process_shard(model, spec, ns_dir, s.id, s.keys, s.texts)
        if after_shard is not None:
            after_shard(res)
        on_result(res)
    return 1


def embed_texts(
    texts: Sequence[str],
    store_root: str | os.PathLike,
    spec: EmbedSpec,
    *,
    model=None,
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
    shard where it ran (in the worker for Ray).  Raises :class:`ManifestMismatch`
    when the store holds shards of other settings or another corpus (unless
    ``add_corpus``), before any work.
    """
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray'; got {engine!r}")
    if engine == "ray":
        from posfair.distributed.ray_engine import require_ray

        require_ray()
    t0 = time.perf_counter()
    if model is None:  # on Ray the driver only needs the fingerprint and dimension: keep it off the GPUs
        model = spec.load_model("cpu" if engine == "ray" else None)
    cal = spec.calibration_obj
    shards = plan_shards(texts, shard_size)
    all_keys = [k for s in shards for k in s.keys]
    from posfair import compat  # sentence-transformers 5.x / 6.x name the dimension differently

    dim = compat.embedding_dimension(model)
    meta = embedding_meta(model.fingerprint, cal, spec.prompt)
    ns_dir = EmbeddingStore(store_root).namespace_dir(**meta)
    settings = run_settings(
        meta, **embedding_settings(model.fingerprint, cal, spec.prompt, dim=dim, text_field=text_field), model=spec.model or "bundled"
    )
    corpus = {"fingerprint": corpus_fingerprint(all_keys), "source": corpus_source, "texts": len(all_keys)}
    present: set[str] = set()
    # settings check, every shard verified (damaged ones set aside: their keys are missing below)
    manifest = open_namespace_dir(ns_dir, settings, lambda name, keys, vectors: present.update(keys), write=False)
    manifest = _add_corpus(ns_dir, manifest, corpus, present.issuperset(all_keys), add_corpus)
    atomic_write_json(ns_dir / MANIFEST, manifest)

    share = None
    if cal is not None:  # counted once for the corpus (token lengths only), not per shard
        coverage = model.calibration_coverage([t for s in shards for t in s.texts], cal, prompt=spec.prompt)
        share = coverage.share
        if coverage.message() is not None:
            warnings.warn(f"posfair embed: {coverage.message()}", CalibrationFallbackWarning, stacklevel=2)

    todo: list[Shard] = []
    skipped = 0
    for s in shards:
        if (ns_dir / f"part-{s.id}.npz").exists():
            skipped += 1
            continue
        missing = [i for i, k in enumerate(s.keys) if k not in present]
        if not missing:
            skipped += 1
            continue
        todo.append(Shard(s.id, tuple(s.keys[i] for i in missing), tuple(s.texts[i] for i in missing)))
    if progress is not None:
        progress(len(all_keys) - sum(len(s.keys) for s in todo))
    totals = {"written": 0, "skipped": skipped, "texts": 0, "tokens": 0, "padded": 0}
    sizes = {s.id: len(s.keys) for s in todo}

    def on_result(res: dict) -> None:
        totals[str(res["status"])] += 1
        for k in ("texts", "tokens", "padded"):
            totals[k] += int(res[k])
        if progress is not None:
            progress(sizes[str(res["shard"])])

    n = 1
    if todo:
        if engine == "local":
            n = _run_local(model, spec, ns_dir, todo, on_result, after_shard)
        else:
            from posfair.distributed.ray_engine import run_ray

            n = run_ray(spec, ns_dir, todo, on_result, after_shard, model.fingerprint, ray_address, workers)
    return EmbedReport(
        namespace=str(ns_dir), engine=engine, workers=n, shards=len(shards), written=totals["written"],
        skipped=totals["skipped"], texts=len(all_keys), encoded=totals["texts"], tokens=totals["tokens"],
        padded=totals["padded"], seconds=time.perf_counter() - t0, calibrated_share=share,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------
# corpus input


def read_corpus_texts(
    source: str | None,
    *,
    text_field: str = "text",
    unit: str | None = None,
    langs: Sequence[str] | None = None,
    benchmark_part: str | None = None,
    lang: str | None = None,
) -> tuple[list[str], str]:
    """Texts to embed and a description of their source.

    ``source``: None/"bundled" (the bundled corpus), a posfair corpus (.parquet /
    .jsonl / save_to_disk folder / HF dataset, via :func:`posfair.corpus.load_corpus`),
    or a plain .parquet / .jsonl whose ``text_field`` holds the texts (only that
    column is read).  With ``benchmark_part`` ("documents" or "queries"),
    ``source`` is a retrieval benchmark (name or folder, e.g. a PosIR tree; ``lang``
    for PosIR) and its corpus or query texts are returned.
    """
    if benchmark_part is not None:
        from posfair.retrieval.benchmarks import load_benchmark

        if benchmark_part not in ("documents", "queries"):
            raise ValueError(f"benchmark part must be 'documents' or 'queries'; got {benchmark_part!r}")
        bench = load_benchmark(str(source), lang=lang)
        texts = bench.corpus_texts if benchmark_part == "documents" else bench.query_texts
        return list(texts), f"benchmark {bench.name} ({benchmark_part})"
    path = Path(source).expanduser() if source not in (None, "bundled") else None
    plain = path is not None and path.is_file() and path.suffix.lower() in (".parquet", ".pq", ".jsonl", ".json")
    if plain and (text_field != "text" or not _has_posfair_fields(path)):
        return _read_text_column(path, text_field), f"{path} [{text_field}]"
    from posfair.corpus import load_corpus

    df = load_corpus(source, unit=unit, langs=langs)
    if text_field not in df.columns:
        raise ValueError(f"corpus {source or 'bundled'} has no field {text_field!r} (fields: {list(df.columns)})")
    desc = f"{source or 'bundled'} [{text_field}]" + (f" unit={unit}" if unit else "") + (f" langs={','.join(langs)}" if langs else "")
    return check_texts(df[text_field].tolist(), f"corpus {source or 'bundled'}", text_field), desc


def _has_posfair_fields(path: Path) -> bool:
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        names = set(pq.read_schema(path).names)
    else:
        with open(path, encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), "{}")
        rec = json.loads(first)
        names = set(rec) if isinstance(rec, dict) else set()
    return {"id", "lang", "text"} <= names


def _read_text_column(path: Path, field: str) -> list[str]:
    lines = None
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        if field not in pq.read_schema(path).names:
            raise ValueError(f"{path}: no column {field!r} (columns: {pq.read_schema(path).names})")
        texts = pq.read_table(path, columns=[field]).column(field).to_pylist()
    else:
        texts, lines = [], []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
                if not isinstance(rec, dict) or field not in rec:
                    raise ValueError(f"{path}: line {n} has no field {field!r}")
                texts.append(rec[field])
                lines.append(n)
    return check_texts(texts, str(path), field, lines)
