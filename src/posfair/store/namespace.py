"""Namespaces: sets of vectors of one kind and dimension, addressed by key, in a store folder.

An :class:`EmbeddingStore` is a folder of namespaces; each namespace is a folder
named by a hash of its defining metadata (``meta.json``), holding shards and a
manifest.  Opening one runs the manifest check and checks its shards
(:func:`~posfair.store.manifest.scan_namespace`) without reading them into memory.  Keys are caller-chosen
strings; :func:`text_key` gives the usual one.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from posfair.calibration.choice import Resolved
from posfair.files.atomic import atomic_write_json
from posfair.runtime.errors import PosfairReadError
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store.keyindex import ShardSet
from posfair.store.manifest import ManifestMismatch, read_manifest, rebuilt_settings, scan_namespace, write_manifest
from posfair.store.settings import (
    MANIFEST,
    canonical,
    code_version,
    embedding_meta,
    embedding_settings,
    run_settings,
)
from posfair.store.shards import SHARD_SUFFIX, ChangedShard, DamagedShard, ShardFile, reading, set_aside, write_shard

__all__ = ["EmbeddingStore", "Namespace", "embedding_namespace", "text_key"]


def text_key(text: str, *extra: str) -> str:
    """The cache key of a text: sha256 over the text and any extra qualifiers."""
    h = hashlib.sha256()
    for part in (*extra, text):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def _namespace_id(meta: dict[str, Any]) -> str:
    blob = json.dumps(meta, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _ensure_meta(path: Path, meta: dict[str, Any]) -> None:
    """Create a namespace folder with its ``meta.json``, or check the existing one agrees."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"embedding store namespace {path} is a file, not a folder")
    path.mkdir(parents=True, exist_ok=True)
    meta_file = path / "meta.json"
    want = canonical(meta)
    if meta_file.exists():
        try:
            with reading(meta_file):  # the system's errors (too many open files, ...) are errors, not damage
                stored = json.loads(meta_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            set_aside(meta_file, f"not readable: {exc}", what="namespace metadata", then="it is written again")
            atomic_write_json(meta_file, meta)  # the folder name is the hash of the metadata: rewrite it
            return
        if stored != want:
            raise ValueError(f"embedding store namespace {path} holds different metadata: {stored} != {meta}")
    else:
        _note_other_code(path, want)
        atomic_write_json(meta_file, meta)


def _note_other_code(path: Path, meta: dict[str, Any]) -> None:
    """Before a namespace is made: warn when the store holds namespaces that differ from it only in the model
    fingerprint and were made by other posfair code, whose vectors this run therefore cannot reuse (e.g. the
    same model, fingerprinted by an older posfair: its fingerprint then depended on the model folder's path)."""
    mine = code_version()
    others = []
    for other in sorted(path.parent.glob("*/meta.json")):
        if other.parent == path:
            continue
        try:
            their_meta = json.loads(other.read_text(encoding="utf-8"))
            manifest = json.loads((other.parent / MANIFEST).read_text(encoding="utf-8"))
            same = {k: v for k, v in their_meta.items() if k != "model"} == {
                k: v for k, v in meta.items() if k != "model"
            }
        except (OSError, ValueError, AttributeError):
            continue
        if same and any(manifest.get(k) != v for k, v in mine.items()):
            others.append(
                f"{other.parent.name} (posfair {manifest.get('posfair_version')}, code {manifest.get('code_hash')})"
            )
    if others:
        warnings.warn(
            f"embedding store {path.parent}: no vectors yet for model fingerprint {meta.get('model')}; "
            f"{len(others)} {'namespace' if len(others) == 1 else 'namespaces'} of the same settings "
            f"{'was' if len(others) == 1 else 'were'} made by other posfair code ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}): posfair does not reuse them, so if they hold this model's "
            "embeddings (posfair's model fingerprint no longer depends on the model folder's path), these are "
            "computed again; delete those folders to reclaim their space",
            stacklevel=user_stacklevel(),
        )


class Namespace:
    """One set of vectors of the same kind and dimension, addressed by key.

    Opening it runs :func:`scan_namespace` (settings check, shard checks by the
    checksum rule of :mod:`posfair.store.keyindex`, damaged shards set aside, the
    key index loaded or rebuilt); no shard is read into memory: lookups use the
    memory-mapped key index and vectors are memory-mapped views of the shards.
    ``settings``: extra settings of the run (see :func:`embedding_settings`).
    """

    def __init__(self, path: Path, meta: dict[str, Any], settings: dict[str, Any] | None = None):
        self.path = Path(path)
        self.meta = meta
        self.settings = run_settings(meta, **(settings or {}))
        _ensure_meta(self.path, meta)
        self.manifest, self._shards = scan_namespace(self.path, self.settings)

    @property
    def dim(self) -> int | None:
        """The vector dimension (None while the namespace is empty)."""
        return self.manifest.get("dim")

    @property
    def shards(self) -> ShardSet:
        """The namespace's good shards and key index."""
        return self._shards

    def refresh(self) -> None:
        """Pick up shards written since the namespace was opened (e.g. by another process), checking each."""
        self._shards.flush()
        self.manifest, self._shards = scan_namespace(self.path, self.settings)

    def flush(self) -> None:
        """Write the key index with the shards this process added (done by :meth:`get_or_compute`)."""
        self._shards.flush()

    def verify(self) -> list[Path]:
        """Verify every shard fully (checksum over every byte, finite values), whatever the index says.

        Damaged shards are set aside (with a warning) and the namespace is opened again,
        so their keys are missing and get computed again.  Returns the paths set aside.
        """
        self._shards.flush()
        before = set(self.path.glob("part-*.damaged-*"))
        self.manifest, self._shards = scan_namespace(self.path, self.settings, full=True)
        return sorted(set(self.path.glob("part-*.damaged-*")) - before)

    def __len__(self) -> int:
        return len(self._shards)

    def _recovering(self, op: Callable[[], Any]) -> Any:
        """``op()``; when it meets a shard the index trusted but that turns out damaged or gone on
        first read (:class:`ChangedShard`: already set aside, with a warning), the namespace is
        scanned again and ``op`` retried, so the lost keys read as missing instead of failing."""
        for _ in range(len(self._shards.records) + 1):
            try:
                return op()
            except ChangedShard:
                self.refresh()
        return op()

    def __contains__(self, key: str) -> bool:
        return bool(self._recovering(lambda: self._shards.locate([key])[0][0] >= 0))

    def missing(self, keys: Iterable[str]) -> list[str]:
        """Keys not stored yet, in first-seen order, without duplicates."""
        uniq = list(dict.fromkeys(keys))
        shard, _ = self._recovering(lambda: self._shards.locate(uniq))
        return [uniq[i] for i in np.flatnonzero(shard < 0)]

    def get(self, keys: Sequence[str]) -> np.ndarray:
        """Vectors for ``keys`` (all must be present), stacked in order (a copy of those rows only)."""
        keys = list(keys)
        return self._recovering(lambda: self._get(keys))

    def _get(self, keys: list[str]) -> np.ndarray:
        out = np.empty((len(keys), self.dim or 0), dtype=np.float32)
        shard, _ = self._shards.locate(keys, out)  # the vectors copied as each shard is mapped to find its keys
        absent = np.flatnonzero(shard < 0)
        if len(absent):
            raise KeyError(f"{len(absent)} keys are not in the store (first: {keys[absent[0]]})")
        return out

    def chunks(self) -> Iterator[np.ndarray]:
        """Every stored row, shard by shard: each shard's vectors, a memory-mapped view of the file
        (the keys of a row: :meth:`keys_at`).  A key stored in two shards appears twice; the second
        copies' positions are ``shards.redundant_rows()`` (searches skip them)."""
        for _, shard in self._shards:
            yield shard.vectors

    def keys_at(self, positions: np.ndarray) -> np.ndarray:
        """The keys at global row positions (shards in order, as :meth:`chunks` yields them)."""
        positions = np.asarray(positions)
        starts = np.cumsum([0] + [int(r["rows"]) for r in self._shards.records])
        shard = np.searchsorted(starts, positions.reshape(-1), side="right") - 1
        out = np.empty(positions.size, dtype=object)
        for s in np.unique(shard):
            m = shard == s
            out[m] = self._shards.file(int(s)).keys.take(pa.array(positions.reshape(-1)[m] - starts[s])).to_pylist()
        return out.reshape(positions.shape)

    def put(self, keys: Sequence[str], vectors: np.ndarray, name: str | None = None) -> None:
        """Write one shard atomically (temporary file + rename); ``name``: see :func:`write_shard`."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim == 2 and len(vectors) and self.dim is not None and vectors.shape[1] != self.dim:
            raise ValueError(
                f"{self.path} holds vectors of {self.dim} dimensions; refusing to add vectors of {vectors.shape[1]}"
            )
        name = write_shard(self.path, keys, vectors, name, settings=self.settings)
        if name is None:
            return
        self._shards.add(self.path / name, [str(k) for k in keys])
        if self.dim is None:
            self.manifest = write_manifest(self.path, {**self.manifest, "dim": int(vectors.shape[1])})

    def get_or_compute(
        self,
        keys: Sequence[str],
        items: Sequence[Any],
        compute: Callable[[list[Any]], np.ndarray],
        chunk_size: int = 256,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Return vectors for ``keys``, computing the missing ones with ``compute(items)``.

        ``items[i]`` is what ``compute`` needs for ``keys[i]`` (usually the text).
        Missing items are computed in chunks of ``chunk_size``; each chunk is
        stored as one shard before the next starts, so a killed run loses at
        most one chunk.  ``progress(n)`` is called with the number of items done.
        The key index is written once at the end (a killed run's shards are
        verified and indexed when the namespace is next opened).
        """
        if len(keys) != len(items):
            raise ValueError(f"{len(keys)} keys but {len(items)} items")
        # a trusted shard found damaged on first read (set aside): scan again, compute its keys again
        return self._recovering(lambda: self._get_or_compute(keys, items, compute, chunk_size, progress))

    def _get_or_compute(self, keys, items, compute, chunk_size, progress) -> np.ndarray:
        todo = self.missing(keys)
        if todo:
            first = {}
            for k, it in zip(keys, items, strict=True):  # lengths checked above
                first.setdefault(k, it)
            for start in range(0, len(todo), chunk_size):
                chunk = todo[start : start + chunk_size]
                vecs = np.asarray(compute([first[k] for k in chunk]), dtype=np.float32)
                if len(vecs) != len(chunk):
                    raise ValueError(f"compute returned {len(vecs)} vectors for {len(chunk)} items")
                self.put(chunk, vecs)
                if progress is not None:
                    progress(len(chunk))
            self.flush()
        return self._get(list(keys))


class EmbeddingStore:
    """A directory of :class:`Namespace` s."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"embedding store {self.root} is a file, not a folder")
        self.root.mkdir(parents=True, exist_ok=True)
        self._open: dict[str, Namespace] = {}

    def namespace(self, **meta: Any) -> Namespace:
        """The namespace defined by ``meta`` (e.g. model=fingerprint, calibration=key, kind='sentence')."""
        return self.open_namespace(meta)

    def open_namespace(self, meta: dict[str, Any], settings: dict[str, Any] | None = None) -> Namespace:
        """The namespace defined by ``meta``, opened with the run's extra ``settings`` (see :class:`Namespace`)."""
        meta = canonical(meta)
        nid = _namespace_id(meta)
        if nid not in self._open:
            self._open[nid] = Namespace(self.root / nid, meta, settings)
        return self._open[nid]

    def namespace_dir(self, **meta: Any) -> Path:
        """The folder of the namespace defined by ``meta``, created (with its meta.json) but not loaded.

        For writers that add shards without reading the vectors already there (``posfair embed``,
        which checks it with :func:`scan_namespace`).
        """
        meta = canonical(meta)
        path = self.root / _namespace_id(meta)
        _ensure_meta(path, meta)
        return path


def embedding_namespace(
    store: EmbeddingStore, fingerprint: str, calibration: Resolved, prompt: str | None = None
) -> Namespace:
    """The one namespace of *pooled embeddings of texts* for a model, calibration and prompt.

    Every part of posfair (``encode``, the audit's segments and documents, the
    retrieval queries and documents, sweeps, ``posfair embed`` on Ray) reads and
    writes pooled embeddings here, keyed by :func:`text_key` of the text, stored
    exactly as the model returns them (consumers normalise when they need to).
    So an embedding computed once, by any command, is never computed again.
    Opening it checks the namespace's manifest (:func:`scan_namespace`).
    """
    return store.open_namespace(
        embedding_meta(fingerprint, calibration, prompt), embedding_settings(fingerprint, calibration, prompt)
    )


def verify_store(root: str | os.PathLike) -> list[dict[str, Any]]:
    """Verify every shard of every namespace under ``root`` (or of ``root`` itself when it is one
    namespace folder) fully: checksum over every byte, finite values, structure, settings.

    Damaged shards are set aside (renamed ``*.damaged-<n>``, with a :class:`DamagedShardWarning`;
    the next run that needs their keys computes them again); nothing is deleted and no vector is
    computed.  Returns one record per namespace: ``namespace`` (folder), ``shards``, ``rows``,
    ``keys`` (distinct), ``duplicate_rows`` (second copies of a key, which lookups and searches
    skip), ``damaged`` (the paths set aside) and ``error`` (why the namespace could not be
    checked at all, e.g. a shard made with other settings; None otherwise).  A file the
    operating system would not open or read (too many open files, permission, an I/O error)
    raises :class:`~posfair.runtime.errors.PosfairReadError` naming it: nothing is set aside for it.
    """

    def _shard_settings(folder: Path) -> dict[str, Any]:  # no manifest: the settings the first readable shard records
        for f in sorted(folder.glob(f"part-*{SHARD_SUFFIX}")):
            try:
                return rebuilt_settings(ShardFile(f).info["settings"])
            except (DamagedShard, FileNotFoundError):
                continue
        return {}

    root = Path(root)
    folders = [root] if (root / "meta.json").is_file() else sorted(p.parent for p in root.glob("*/meta.json"))
    out = []
    for folder in folders:
        before = set(folder.glob("part-*.damaged-*"))
        rec: dict[str, Any] = {
            "namespace": str(folder),
            "shards": 0,
            "rows": 0,
            "keys": 0,
            "duplicate_rows": 0,
            "damaged": [],
            "error": None,
        }
        try:
            settings = read_manifest(folder / MANIFEST) or _shard_settings(folder)
            # no manifest and no readable shard: the shards are still checked (set aside), no manifest is written
            _, shards = scan_namespace(folder, settings, full=True, write=bool(settings))
            rec.update(
                shards=len(shards.records), rows=shards.rows, keys=len(shards), duplicate_rows=shards.rows - len(shards)
            )
        except PosfairReadError:  # the machine's fault, not the namespace's: stop, naming the file and the cause
            raise
        except (ManifestMismatch, OSError, ValueError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["damaged"] = sorted(str(p) for p in set(folder.glob("part-*.damaged-*")) - before)
        out.append(rec)
    return out
