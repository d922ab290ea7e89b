"""A content-addressed, crash-safe, self-checking embedding cache.

Layout of a store root::

    ROOT/
      <namespace-id>/            one per (model fingerprint, calibration, kind, ...)
        meta.json               the namespace's defining metadata (written once, atomically)
        manifest.json           the settings the vectors were made with (see below)
        part-<id>.npz           shards: ``keys`` (unicode), ``vectors`` (float32, n x d) and
                                ``meta`` (JSON: row count, dimension, settings, sha256 checksum)

Every shard is written to a temporary file and renamed into place, so a run
killed at any moment leaves only complete shards; the next run reads them and
computes only what is missing.  Shards are plain NumPy arrays read with
``allow_pickle=False`` (no pickle anywhere).

Every shard carries a checksum over its keys, vectors and metadata.  A shard
that cannot be read, has no checksum, fails it, or holds vectors that are not
finite float32 rows of the namespace's dimension is *damaged*: it is renamed
``part-<id>.npz.damaged-<n>`` in the same folder (never deleted), named in a
:class:`DamagedShardWarning`, and its keys are computed again.

``manifest.json`` records the settings of the namespace (its metadata, the
vector dimension, posfair's version and a hash of the code that computes
embeddings; ``posfair embed`` adds the corpora).  :func:`open_namespace_dir` is
the one check every command runs when it opens a namespace: settings that
disagree with the manifest, or a shard made with other settings, raise
:class:`ManifestMismatch` naming the folder and the setting.  A missing
manifest is rebuilt from the shards' own metadata (with a warning).

Keys are caller-chosen strings; :func:`text_key` gives the usual one (sha256 of
the text, plus any prefix such as a prompt).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
import warnings
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posfair.errors import PosfairInputError
from posfair.io import atomic_path, atomic_write_json

__all__ = [
    "EmbeddingStore",
    "Namespace",
    "ManifestMismatch",
    "DamagedShardWarning",
    "DamagedShard",
    "MANIFEST",
    "write_shard",
    "read_shard",
    "set_aside",
    "open_namespace_dir",
    "run_settings",
    "code_version",
    "embedding_meta",
    "embedding_settings",
    "text_key",
    "embedding_namespace",
    "calibration_tag",
    "STOCK",
]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2
SHARD_FORMAT = 2
# the modules whose code determines an embedding (a change may change the vectors)
_CODE_MODULES = ("posfair.model", "posfair.calibration")
# settings a shard records about itself (enough to rebuild the manifest from the shards)
_SHARD_SETTINGS = ("namespace", "fingerprint", "calibration", "prompt", "posfair_version", "code_hash")
# settings that must be recorded and equal; the others are compared when both sides know them
_STRICT = ("format", "namespace", "posfair_version", "code_hash")
# recorded only, never compared ("model" is the name: the same weights under another path have the same fingerprint)
_RECORDED = ("model", "corpora")


class ManifestMismatch(PosfairInputError):
    """A run's settings disagree with the vectors already in a store namespace; nothing was written."""


class DamagedShardWarning(UserWarning):
    """A damaged cache file was found and renamed aside; its vectors are computed again."""


class DamagedShard(ValueError):
    """A shard file that cannot be trusted (unreadable, no or wrong checksum, bad shape, non-finite values)."""


def text_key(text: str, *extra: str) -> str:
    """The cache key of a text: sha256 over the text and any extra qualifiers."""
    h = hashlib.sha256()
    for part in (*extra, text):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def _canonical(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _namespace_id(meta: dict[str, Any]) -> str:
    blob = json.dumps(meta, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """posfair's version and a hash of the sources that compute embeddings (model + calibration)."""
    import importlib.util

    from posfair import __version__

    h = hashlib.sha256()
    for name in _CODE_MODULES:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin)
        files = sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return {"posfair_version": __version__, "code_hash": h.hexdigest()[:16]}


def run_settings(meta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The settings a run opens a namespace with: its metadata, posfair's code version and ``extra``
    (e.g. fingerprint, calibration, prompt, dim; None = not known to this run)."""
    return _canonical({"format": MANIFEST_FORMAT, "namespace": meta, **code_version(), **extra})


# ------------------------------------------------------------------------------------------
# shards


def _checksum(info: dict[str, Any], keys: Sequence[str], vectors: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(info, sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\x00")
    for k in keys:
        h.update(str(k).encode("utf-8"))
        h.update(b"\x00")
    h.update(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
    return h.hexdigest()


def _folder_settings(folder: Path) -> dict[str, Any]:
    meta_file = folder / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else None
    return run_settings(meta)


def write_shard(
    folder: str | os.PathLike,
    keys: Sequence[str],
    vectors: np.ndarray,
    name: str | None = None,
    settings: dict[str, Any] | None = None,
) -> str | None:
    """Write ``keys`` + ``vectors`` as one shard file of a namespace folder, atomically, with its checksum.

    ``name`` is the shard's identity (a file ``part-<name>.npz``; e.g. a hash of its
    keys, so a rerun finds it); None = a random one.  ``settings``: what the vectors
    were made with (see :func:`run_settings`; default: the folder's ``meta.json`` and
    this posfair's code version), recorded in the shard so that a lost manifest can
    be rebuilt.  Returns the file name, or None when there is nothing to write.
    Refuses vectors that are not finite (NaN / inf are never cached).  Used by
    :meth:`Namespace.put` and by workers that write into a namespace without
    loading it (``posfair embed``).
    """
    folder = Path(folder)
    vectors = np.asarray(vectors, dtype=np.float32)
    keys = [str(k) for k in keys]
    if len(keys) != len(vectors):
        raise ValueError(f"{len(keys)} keys but {len(vectors)} vectors")
    if not len(keys):
        return None
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be a 2-d array (rows x dim); got shape {vectors.shape}")
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(
            f"{len(bad)} of {len(keys)} vectors hold NaN or infinite values (first: row {bad[0]}, key {keys[bad[0]]}); "
            "refusing to cache them"
        )
    if name is not None and (not name or not all(c.isalnum() or c in "-_" for c in name)):
        raise ValueError(f"shard name must be letters, digits, '-' or '_'; got {name!r}")
    settings = _folder_settings(folder) if settings is None else _canonical(settings)
    info = {
        "format": SHARD_FORMAT,
        "rows": len(keys),
        "dim": int(vectors.shape[1]),
        "settings": {k: settings[k] for k in _SHARD_SETTINGS if k in settings},
    }
    meta = {**info, "sha256": _checksum(info, keys, vectors)}
    fname = f"part-{name or uuid.uuid4().hex}.npz"
    with atomic_path(folder / fname) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=np.asarray(keys, dtype=str), vectors=vectors, meta=np.asarray(json.dumps(meta, sort_keys=True)))
    return fname


def read_shard(path: str | os.PathLike) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    """``(keys, vectors, meta)`` of a shard file, after checking it; raises :class:`DamagedShard`."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise DamagedShard("empty file: 0 bytes")
    if not zipfile.is_zipfile(path):  # numpy would say "pickled data" for any non-archive bytes
        raise DamagedShard(f"not a complete .npz archive: {size} bytes, cut short or overwritten")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise DamagedShard("not an .npz archive")
            names = set(z.files)
            if not {"keys", "vectors"} <= names:
                raise DamagedShard(f"it lacks the keys/vectors arrays (has {sorted(names)})")
            if "meta" not in names:
                raise DamagedShard("it has no checksum (written by an older posfair or another program)")
            keys, vectors, raw = z["keys"], z["vectors"], z["meta"]
    except (DamagedShard, PermissionError, MemoryError):
        raise
    except Exception as exc:  # a damaged archive raises any of several errors (bad CRC, short member, ...)
        detail = f": {exc}" if str(exc) and "pickle" not in str(exc) else ""
        raise DamagedShard(f"unreadable .npz archive: {type(exc).__name__}{detail}") from None
    try:
        meta = json.loads(str(raw[()]))
        info = {k: meta[k] for k in ("format", "rows", "dim", "settings")}
        expected = meta["sha256"]
    except Exception:
        raise DamagedShard("its metadata is not readable JSON with a checksum") from None
    if keys.ndim != 1 or keys.dtype.kind != "U":
        raise DamagedShard(f"its keys are a {keys.dtype} array of shape {keys.shape}, not a list of strings")
    if vectors.dtype != np.float32 or vectors.ndim != 2:
        raise DamagedShard(f"its vectors are {vectors.dtype} of shape {vectors.shape}, not float32 rows")
    if vectors.shape != (info["rows"], info["dim"]) or len(keys) != info["rows"]:
        raise DamagedShard(
            f"it holds {len(keys)} keys and vectors of shape {vectors.shape}, but its metadata says {info['rows']} x {info['dim']}"
        )
    key_list = keys.tolist()
    if _checksum(info, key_list, vectors) != expected:
        raise DamagedShard("checksum mismatch")
    if not np.isfinite(vectors).all():
        raise DamagedShard(f"{int((~np.isfinite(vectors)).sum())} NaN or infinite values")
    return key_list, vectors, meta


def set_aside(path: str | os.PathLike, reason: str, what: str = "cache shard", then: str = "its vectors are recomputed") -> Path | None:
    """Rename a damaged file to ``<name>.damaged-<n>`` next to it (never delete) and warn naming both.

    Returns the new path, or None when the file had gone already (another process set it aside).
    """
    path = Path(path)
    n = 1
    while path.with_name(f"{path.name}.damaged-{n}").exists():
        n += 1
    target = path.with_name(f"{path.name}.damaged-{n}")
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    warnings.warn(f"damaged {what} {path} ({reason}): moved to {target}; {then}", DamagedShardWarning, stacklevel=2)
    return target


# ------------------------------------------------------------------------------------------
# the manifest: one check for every command


def _diffs(have: dict[str, Any], want: dict[str, Any], keys: Iterable[str], have_name: str, want_name: str) -> list[str]:
    out = []
    for k in keys:
        if k in _RECORDED:
            continue
        h, w = have.get(k), want.get(k)
        if k not in _STRICT and (h is None or w is None):
            continue  # not known to one side (e.g. the dimension before the first vector)
        if h != w:
            out.append(f"{k}: {have_name} has {h!r}, {want_name} has {w!r}")
    return out


def _ordered(*dicts: dict[str, Any]) -> list[str]:
    keys: list[str] = []
    for d in dicts:
        keys.extend(k for k in d if k not in keys)
    return keys


def _mismatch(where: str, diffs: list[str], ns_dir: Path) -> ManifestMismatch:
    return ManifestMismatch(
        f"{where} was made with other settings ({'; '.join(diffs)}): refusing to mix them; "
        f"use another store folder, or delete {ns_dir} to recompute it"
    )


def _read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(have, dict):
            raise ValueError("not a JSON object")
        return have
    except (ValueError, UnicodeDecodeError) as exc:
        set_aside(path, f"not readable: {exc}", what="store manifest", then="it is rebuilt from the shards")
        return None


def open_namespace_dir(
    ns_dir: str | os.PathLike,
    settings: dict[str, Any],
    on_shard: Callable[[str, list[str], np.ndarray], None] | None = None,
    seen: Iterable[str] = (),
    write: bool = True,
) -> dict[str, Any]:
    """Check a namespace folder against a run's ``settings``; verify and read its shards.

    The one check of every command that reads or writes a store namespace (audit,
    retrieval, sweep, tune, encode, embed):

    * ``manifest.json`` must agree with ``settings`` (:func:`run_settings`), else
      :class:`ManifestMismatch` naming the folder and the setting, before any shard
      is touched;
    * every shard ``part-*.npz`` (except the file names in ``seen``) is read and
      checked (:func:`read_shard`); a damaged one is set aside (:func:`set_aside`)
      and skipped, so its keys count as missing; one made with other settings
      raises :class:`ManifestMismatch` naming it; ``on_shard(name, keys, vectors)``
      gets each good one;
    * a missing manifest is rebuilt from the shards' own metadata (with a warning).

    Returns the manifest: the stored one completed with what this run knows (the
    dimension, ...), written back when it changed and ``write``.
    """
    ns_dir = Path(ns_dir)
    settings = _canonical(settings)
    mpath = ns_dir / MANIFEST
    have = _read_manifest(mpath)
    if have is not None:
        diffs = _diffs(have, settings, _ordered(settings, have), "the store", "this run")
        if diffs:
            raise _mismatch(f"store {ns_dir}", diffs, ns_dir)
        manifest = dict(have)
    else:
        manifest = None
    n_good = 0
    for f in sorted(ns_dir.glob("part-*.npz")):
        if f.name in seen:
            continue
        try:
            keys, vectors, meta = read_shard(f)
        except DamagedShard as exc:
            set_aside(f, str(exc))
            continue
        own = {**meta["settings"], "dim": meta["dim"]}
        reference = manifest if manifest is not None else settings
        diffs = _diffs(reference, own, list(own), "the store" if manifest is not None else "this run", "the shard")
        if diffs:
            raise _mismatch(f"shard {f}", diffs, ns_dir)
        if manifest is None:  # rebuild the manifest from the first good shard
            manifest = {**settings, **{k: v for k, v in own.items() if v is not None}}
        elif manifest.get("dim") is None:
            manifest["dim"] = meta["dim"]
        n_good += 1
        if on_shard is not None:
            on_shard(f.name, keys, vectors)
    if have is None and n_good:
        warnings.warn(f"store {ns_dir} had no readable {MANIFEST}: rebuilt it from the metadata of its {n_good} shards", stacklevel=2)
    manifest = manifest if manifest is not None else dict(settings)
    for k, v in settings.items():  # complete it with what this run knows
        if v is not None and (manifest.get(k) is None or k not in _RECORDED):
            manifest[k] = v
    if write and manifest != have:
        atomic_write_json(mpath, manifest)
    return manifest


# ------------------------------------------------------------------------------------------
# namespaces


def _ensure_meta(path: Path, meta: dict[str, Any]) -> None:
    """Create a namespace folder with its ``meta.json``, or check the existing one agrees."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"embedding store namespace {path} is a file, not a folder")
    path.mkdir(parents=True, exist_ok=True)
    meta_file = path / "meta.json"
    want = _canonical(meta)
    if meta_file.exists():
        try:
            stored = json.loads(meta_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            set_aside(meta_file, f"not readable: {exc}", what="namespace metadata", then="it is written again")
            atomic_write_json(meta_file, meta)  # the folder name is the hash of the metadata: rewrite it
            return
        if stored != want:
            raise ValueError(f"embedding store namespace {path} holds different metadata: {stored} != {meta}")
    else:
        atomic_write_json(meta_file, meta)


class Namespace:
    """One set of vectors of the same kind and dimension, addressed by key.

    Opening it runs :func:`open_namespace_dir` (settings check, shard checks,
    damaged shards set aside); ``settings``: extra settings of the run (see
    :func:`embedding_settings`).
    """

    def __init__(self, path: Path, meta: dict[str, Any], settings: dict[str, Any] | None = None):
        self.path = Path(path)
        self.meta = meta
        self.settings = run_settings(meta, **(settings or {}))
        self._index: dict[str, tuple[int, int]] = {}
        self._shards: list[np.ndarray] = []
        self._seen_files: set[str] = set()
        _ensure_meta(self.path, meta)
        self.manifest = open_namespace_dir(self.path, self.settings, self._add)

    @property
    def dim(self) -> int | None:
        """The vector dimension (None while the namespace is empty)."""
        return self.manifest.get("dim")

    def _add(self, name: str, keys: Sequence[str], vectors: np.ndarray) -> None:
        shard = len(self._shards)
        self._shards.append(vectors)
        for row, k in enumerate(keys):
            self._index.setdefault(k, (shard, row))
        self._seen_files.add(name)

    def refresh(self) -> None:
        """Pick up shards written since the namespace was opened (e.g. by another process), checking each."""
        self.manifest = open_namespace_dir(self.path, self.settings, self._add, seen=self._seen_files)

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
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        return np.stack([self._shards[s][r] for s, r in (self._index[k] for k in keys)])

    def put(self, keys: Sequence[str], vectors: np.ndarray, name: str | None = None) -> None:
        """Write one shard atomically (temporary file + rename); ``name``: see :func:`write_shard`."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim == 2 and len(vectors) and self.dim is not None and vectors.shape[1] != self.dim:
            raise ValueError(f"{self.path} holds vectors of {self.dim} dimensions; refusing to add vectors of {vectors.shape[1]}")
        name = write_shard(self.path, keys, vectors, name, settings=self.settings)
        if name is None:
            return
        self._add(name, list(keys), vectors)
        if self.dim is None:
            self.manifest = {**self.manifest, "dim": int(vectors.shape[1])}
            atomic_write_json(self.path / MANIFEST, self.manifest)

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
            for k, it in zip(keys, items, strict=False):
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
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"embedding store {self.root} is a file, not a folder")
        self.root.mkdir(parents=True, exist_ok=True)
        self._open: dict[str, Namespace] = {}

    def namespace(self, **meta: Any) -> Namespace:
        """The namespace defined by ``meta`` (e.g. model=fingerprint, calibration=key, kind='sentence')."""
        return self.open_namespace(meta)

    def open_namespace(self, meta: dict[str, Any], settings: dict[str, Any] | None = None) -> Namespace:
        """The namespace defined by ``meta``, opened with the run's extra ``settings`` (see :class:`Namespace`)."""
        meta = _canonical(meta)
        nid = _namespace_id(meta)
        if nid not in self._open:
            self._open[nid] = Namespace(self.root / nid, meta, settings)
        return self._open[nid]

    def namespace_dir(self, **meta: Any) -> Path:
        """The folder of the namespace defined by ``meta``, created (with its meta.json) but not loaded.

        For writers that add shards without reading the vectors already there (``posfair embed``,
        which checks it with :func:`open_namespace_dir`).
        """
        meta = _canonical(meta)
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
    Opening it checks the namespace's manifest (:func:`open_namespace_dir`).
    """
    return store.open_namespace(embedding_meta(fingerprint, calibration, prompt), embedding_settings(fingerprint, calibration, prompt))


def embedding_meta(fingerprint: str, calibration=None, prompt: str | None = None) -> dict[str, Any]:
    """The metadata defining :func:`embedding_namespace` (for :meth:`EmbeddingStore.namespace_dir`)."""
    return dict(model=fingerprint, calibration=calibration_tag(calibration), kind="embedding", prompt=prompt or "")


def embedding_settings(fingerprint: str, calibration=None, prompt: str | None = None, **extra: Any) -> dict[str, Any]:
    """The manifest settings of an :func:`embedding_namespace` beyond its metadata (``extra``: e.g. dim)."""
    return dict(fingerprint=fingerprint, calibration=calibration.to_dict() if calibration else None, prompt=prompt or "", **extra)
