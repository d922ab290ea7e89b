"""A content-addressed, crash-safe embedding cache.

Layout of a store root::

    ROOT/
      <namespace-id>/            one per (model fingerprint, calibration, kind, ...)
        meta.json               the namespace's defining metadata (written once, atomically)
        part-<uuid>.npz          shards: ``keys`` (unicode array) + ``vectors`` (float32, n x d)

Every shard is written to a temporary file and renamed into place, so a run
killed at any moment leaves only complete shards; the next run reads them and
computes only what is missing.  Shards are plain NumPy arrays read with
``allow_pickle=False`` (no pickle anywhere).

Keys are caller-chosen strings; :func:`text_key` gives the usual one (sha256 of
the text, plus any prefix such as a prompt).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from posfair.io import atomic_path, atomic_write_json

__all__ = ["EmbeddingStore", "Namespace", "write_shard", "embedding_meta", "text_key", "embedding_namespace", "encode_cached", "calibration_tag", "STOCK"]


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


def write_shard(folder: str | os.PathLike, keys: Sequence[str], vectors: np.ndarray, name: str | None = None) -> str | None:
    """Write ``keys`` + ``vectors`` as one shard file of a namespace folder, atomically.

    ``name`` is the shard's identity (a file ``part-<name>.npz``; e.g. a hash of its
    keys, so a rerun finds it); None = a random one.  Returns the file name, or None
    when there is nothing to write.  Used by :meth:`Namespace.put` and by workers
    that write into a namespace without loading it (``posfair embed``).
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if len(keys) != len(vectors):
        raise ValueError(f"{len(keys)} keys but {len(vectors)} vectors")
    if not len(keys):
        return None
    if name is not None and (not name or not all(c.isalnum() or c in "-_" for c in name)):
        raise ValueError(f"shard name must be letters, digits, '-' or '_'; got {name!r}")
    fname = f"part-{name or uuid.uuid4().hex}.npz"
    with atomic_path(Path(folder) / fname) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=np.asarray(list(keys), dtype=str), vectors=vectors)
    return fname


def _ensure_meta(path: Path, meta: dict[str, Any]) -> None:
    """Create a namespace folder with its ``meta.json``, or check the existing one agrees."""
    path.mkdir(parents=True, exist_ok=True)
    meta_file = path / "meta.json"
    if meta_file.exists():
        stored = json.loads(meta_file.read_text())
        if stored != json.loads(json.dumps(meta, sort_keys=True, default=str)):
            raise ValueError(f"embedding store namespace {path} holds different metadata: {stored} != {meta}")
    else:
        atomic_write_json(meta_file, meta)


class Namespace:
    """One set of vectors of the same kind and dimension, addressed by key."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = meta
        self._index: dict[str, tuple[int, int]] = {}
        self._shards: list[np.ndarray] = []
        self._seen_files: set[str] = set()
        _ensure_meta(self.path, meta)
        self.refresh()

    def refresh(self) -> None:
        """Pick up shards written since the namespace was opened (e.g. by another process)."""
        for f in sorted(self.path.glob("part-*.npz")):
            if f.name in self._seen_files:
                continue
            with np.load(f, allow_pickle=False) as z:
                keys, vectors = z["keys"], z["vectors"]
            shard = len(self._shards)
            self._shards.append(vectors)
            for row, k in enumerate(keys.tolist()):
                self._index.setdefault(k, (shard, row))
            self._seen_files.add(f.name)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def missing(self, keys: Iterable[str]) -> list[str]:
        """Keys not stored yet, in first-seen order, without duplicates."""
        out, seen = [], set()
        for k in keys:
            if k not in self._index and k not in seen:
                seen.add(k)
                out.append(k)
        return out

    def get(self, keys: Sequence[str]) -> np.ndarray:
        """Vectors for ``keys`` (all must be present), stacked in order."""
        absent = [k for k in keys if k not in self._index]
        if absent:
            raise KeyError(f"{len(absent)} keys are not in the store (first: {absent[0]})")
        if not keys:
            dim = self._shards[0].shape[1:] if self._shards else (0,)
            return np.zeros((0, *dim), dtype=np.float32)
        return np.stack([self._shards[s][r] for s, r in (self._index[k] for k in keys)])

    def put(self, keys: Sequence[str], vectors: np.ndarray, name: str | None = None) -> None:
        """Write one shard atomically (temporary file + rename); ``name``: see :func:`write_shard`."""
        vectors = np.asarray(vectors, dtype=np.float32)
        name = write_shard(self.path, keys, vectors, name)
        if name is None:
            return
        shard = len(self._shards)
        self._shards.append(vectors)
        for row, k in enumerate(keys):
            self._index.setdefault(k, (shard, row))
        self._seen_files.add(name)

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
        """
        if len(keys) != len(items):
            raise ValueError(f"{len(keys)} keys but {len(items)} items")
        todo = self.missing(keys)
        if todo:
            first = {}
            for k, it in zip(keys, items):
                first.setdefault(k, it)
            for start in range(0, len(todo), chunk_size):
                chunk = todo[start : start + chunk_size]
                vecs = np.asarray(compute([first[k] for k in chunk]), dtype=np.float32)
                if len(vecs) != len(chunk):
                    raise ValueError(f"compute returned {len(vecs)} vectors for {len(chunk)} items")
                self.put(chunk, vecs)
                if progress is not None:
                    progress(len(chunk))
        return self.get(keys)


class EmbeddingStore:
    """A directory of :class:`Namespace` s."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._open: dict[str, Namespace] = {}

    def namespace(self, **meta: Any) -> Namespace:
        """The namespace defined by ``meta`` (e.g. model=fingerprint, calibration=key, kind='sentence')."""
        meta = json.loads(json.dumps(meta, sort_keys=True, default=str))
        nid = _namespace_id(meta)
        if nid not in self._open:
            self._open[nid] = Namespace(self.root / nid, meta)
        return self._open[nid]

    def namespace_dir(self, **meta: Any) -> Path:
        """The folder of the namespace defined by ``meta``, created (with its meta.json) but not loaded.

        For writers that add shards without reading the vectors already there (``posfair embed``).
        """
        meta = json.loads(json.dumps(meta, sort_keys=True, default=str))
        path = self.root / _namespace_id(meta)
        _ensure_meta(path, meta)
        return path


STOCK = "stock"


def calibration_tag(calibration) -> str:
    """How a calibration is named in cache metadata: its stable key, or ``"stock"``."""
    return calibration.key() if calibration else STOCK


def embedding_namespace(store: EmbeddingStore, fingerprint: str, calibration=None, prompt: str | None = None) -> Namespace:
    """The one namespace of *pooled embeddings of texts* for a model, calibration and prompt.

    Every part of posfair (``encode``, the audit's segments and documents, the
    retrieval queries and documents, sweeps, ``posfair embed`` on Ray) reads and
    writes pooled embeddings here, keyed by :func:`text_key` of the text, stored
    exactly as the model returns them (consumers normalise when they need to).
    So an embedding computed once, by any command, is never computed again.
    """
    return store.namespace(**embedding_meta(fingerprint, calibration, prompt))


def embedding_meta(fingerprint: str, calibration=None, prompt: str | None = None) -> dict[str, Any]:
    """The metadata defining :func:`embedding_namespace` (for :meth:`EmbeddingStore.namespace_dir`)."""
    return dict(model=fingerprint, calibration=calibration_tag(calibration), kind="embedding", prompt=prompt or "")


def encode_cached(
    model,
    texts: Sequence[str],
    store: EmbeddingStore | None = None,
    *,
    calibration=None,
    prompt: str | None = None,
    batch_size: int = 32,
    chunk_size: int = 256,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Pooled embeddings of ``texts`` (float32, n x dim) through the cache.

    ``calibration=None`` is the stock model (even when the model carries a
    default calibration).  Without a store, duplicates are still encoded once.
    """
    texts = list(texts)

    def compute(chunk: list[str]) -> np.ndarray:
        out = model.encode(
            list(chunk), calibration=calibration if calibration is not None else False, prompt=prompt,
            batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False,
        )  # fmt: skip
        return np.asarray(out, dtype=np.float32)

    keys = [text_key(t) for t in texts]
    if store is None:
        unique = list(dict.fromkeys(texts))
        vecs = np.concatenate([compute(unique[i : i + chunk_size]) for i in range(0, len(unique), chunk_size)]) if unique else None
        if progress is not None:
            progress(len(unique))
        if vecs is None:
            return np.zeros((0, model.get_embedding_dimension() or 0), dtype=np.float32)
        index = {t: i for i, t in enumerate(unique)}
        return vecs[[index[t] for t in texts]]
    ns = embedding_namespace(store, model.fingerprint, calibration, prompt)
    return ns.get_or_compute(keys, texts, compute, chunk_size=chunk_size, progress=progress)
