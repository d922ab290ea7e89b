"""Shard files: keys + float32 vectors + metadata with a checksum, written atomically, checked on read.

A shard is an Arrow IPC file (``part-<id>.arrow``, one record batch) with two
columns, ``key`` (string) and ``vector`` (``fixed_size_list<float32>[dim]``), and
the schema metadata ``posfair`` (JSON: format, row count, dimension, the settings
it was made with, and ``sha256``, the checksum of its contents).  pyarrow
(``pyarrow.ipc.open_file``), pandas (``pandas.read_feather``) and Hugging Face
``datasets`` (``load_dataset("arrow", data_files=...)``) read it directly.
:class:`ShardFile` memory-maps it (``pyarrow.memory_map``): its vectors are a
NumPy view of the file, never copied into RAM.  It holds no open file: the file is
closed as soon as its structure is read, and the mapping lives as long as the shard
or any array read from it (so however many shards a store has, posfair stays within
the process's open-file limit; the key index keeps a bounded number of shards mapped).

The checksum is a sha256 over the metadata (without the checksum), the byte length
of every key, the keys' UTF-8 bytes and the vectors' little-endian float32 bytes
(:func:`_checksum`).  Opening a shard (:class:`ShardFile`) checks its structure
(an Arrow IPC file with its footer, the two columns, the row count and dimension
of its metadata); :meth:`ShardFile.verify` checks the checksum and that every value
is finite.  When each check runs is the namespace's rule (see
:mod:`posfair.store.keyindex`).  A shard failing either raises :class:`DamagedShard`;
:func:`set_aside` renames such a file ``<name>.damaged-<n>`` (never deleting it)
with a :class:`DamagedShardWarning`.  Only bytes proven bad make a shard damaged: a
file the operating system would not open or map (too many open files, permission,
an I/O error, no memory) raises :class:`~posfair.runtime.errors.PosfairReadError` naming the
file and the cause, and nothing is set aside (a vanished file raises
``FileNotFoundError``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from posfair.files.atomic import atomic_path
from posfair.runtime.errors import PosfairReadError
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store.settings import canonical, run_settings

__all__ = [
    "ChangedShard",
    "DamagedShard",
    "DamagedShardWarning",
    "SHARD_FORMAT",
    "SHARD_SUFFIX",
    "ShardFile",
    "read_shard",
    "reading",
    "set_aside",
    "shard_path",
    "write_shard",
]

SHARD_FORMAT = 3
SHARD_SUFFIX = ".arrow"
_META_KEY = b"posfair"
# settings a shard records about itself (enough to rebuild the manifest from the shards)
_SHARD_SETTINGS = ("namespace", "fingerprint", "calibration", "prompt", "posfair_version", "code_hash")


class DamagedShardWarning(UserWarning):
    """A damaged cache file was found and renamed aside; its vectors are computed again."""


class DamagedShard(ValueError):
    """A shard file that cannot be trusted (unreadable, no or wrong checksum, bad shape, non-finite values)."""


class ChangedShard(DamagedShard):
    """A shard the key index trusted was found damaged or gone when first read (already set aside):
    the namespace must be scanned again, after which its keys are missing and get recomputed."""


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Open or read ``path`` within: an OSError (too many open files, permission denied, an I/O error) becomes
    :class:`~posfair.runtime.errors.PosfairReadError` naming the file and the cause; a vanished file stays
    ``FileNotFoundError`` (another process set it aside or replaced it: the caller's to handle)."""
    try:
        yield
    except (FileNotFoundError, PosfairReadError):
        raise
    except OSError as exc:
        raise PosfairReadError(path, exc) from exc


def shard_path(folder: str | os.PathLike, name: str) -> Path:
    """The file of shard ``name`` in a namespace folder: ``part-<name>.arrow``."""
    return Path(folder) / f"part-{name}{SHARD_SUFFIX}"


def _key_array(keys: Sequence[str] | pa.Array) -> pa.StringArray:
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(keys, pa.Array):
        return keys.cast(pa.string()) if keys.type != pa.string() else keys
    return pa.array([str(k) for k in keys], type=pa.string())


def _checksum(info: dict[str, Any], keys: Sequence[str] | pa.Array, vectors: np.ndarray) -> str:
    """sha256 over ``info`` (JSON), each key's byte length, the keys' bytes and the vectors (``<f4``)."""
    h = hashlib.sha256()
    h.update(json.dumps(info, sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\x00")
    arr = _key_array(keys)
    n = len(arr)
    if n:
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
        h.update(np.diff(offsets).astype("<i8").tobytes())
        data = arr.buffers()[2]
        if data is not None and offsets[-1] > offsets[0]:
            h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
    h.update(memoryview(np.ascontiguousarray(vectors, dtype="<f4")).cast("B"))
    return h.hexdigest()


def _folder_settings(folder: Path) -> dict[str, Any]:
    meta_file = folder / "meta.json"
    with reading(meta_file):
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else None
    return run_settings(meta)


def _schema(dim: int, meta: dict[str, Any]) -> pa.Schema:
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False), pa.field("vector", pa.list_(pa.float32(), dim), nullable=False)],
        metadata={_META_KEY: json.dumps(meta, sort_keys=True).encode()},
    )


def write_shard(
    folder: str | os.PathLike,
    keys: Sequence[str],
    vectors: np.ndarray,
    name: str | None = None,
    settings: dict[str, Any] | None = None,
) -> str | None:
    """Write ``keys`` + ``vectors`` as one shard file of a namespace folder, atomically, with its checksum.

    ``name`` is the shard's identity (a file ``part-<name>.arrow``; e.g. a hash of its
    keys, so a rerun finds it); None = a random one.  ``settings``: what the vectors
    were made with (see :func:`run_settings`; default: the folder's ``meta.json`` and
    this posfair's code version), recorded in the shard so that a lost manifest can
    be rebuilt.  Returns the file name, or None when there is nothing to write.
    Refuses vectors that are not finite (NaN / inf are never cached).  Written to a
    temporary file, flushed to disk and renamed into place: a killed writer leaves no
    partial shard.  Used by :meth:`Namespace.put` and by workers that write into a
    namespace without loading it (``posfair embed``).
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
    settings = _folder_settings(folder) if settings is None else canonical(settings)
    dim = int(vectors.shape[1])
    info = {
        "format": SHARD_FORMAT,
        "rows": len(keys),
        "dim": dim,
        "settings": {k: settings[k] for k in _SHARD_SETTINGS if k in settings},
    }
    key_arr = _key_array(keys)
    meta = {**info, "sha256": _checksum(info, key_arr, vectors)}
    vectors = np.ascontiguousarray(vectors)
    batch = pa.record_batch(
        [key_arr, pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)], schema=_schema(dim, meta)
    )
    fname = shard_path(folder, name or uuid.uuid4().hex).name
    with atomic_path(folder / fname) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    return fname


class ShardFile:
    """One Arrow shard, memory-mapped, its structure checked; raises :class:`DamagedShard` when its bytes are bad,
    :class:`~posfair.runtime.errors.PosfairReadError` when the system would not open or map it (``FileNotFoundError``
    when it is gone).

    ``keys`` is the Arrow string column, ``vectors`` a read-only (rows x dim) float32
    NumPy view of the file (not a copy), ``meta`` the shard's metadata.  The file is
    closed once its structure is read; the mapping stays valid while this object or any
    array taken from it (``keys``, ``vectors`` or a view of them) is alive.
    :meth:`verify` checks the checksum and finiteness (reads every byte).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with reading(self.path):  # the operating system's errors: never a sign of damage
            size = self.path.stat().st_size
            if size == 0:
                raise DamagedShard("empty file: 0 bytes")
            mapped = pa.memory_map(str(self.path), "r")
        try:
            self._read(mapped, size)
        finally:
            mapped.close()  # the file descriptor only: Arrow keeps the mapping while arrays read from it live

    def _read(self, mapped: pa.MemoryMappedFile, size: int) -> None:
        """Check the structure of the mapped file and take its columns (reads only memory, no file)."""
        try:
            reader = pa.ipc.open_file(mapped)
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            _not_damage(self.path, exc)
            raise DamagedShard(f"not a complete Arrow IPC file: {size} bytes, cut short or overwritten") from None
        schema = reader.schema
        raw = (schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise DamagedShard("it has no checksum (written by an older posfair or another program)")
        try:
            meta = json.loads(raw)
            self.info = {k: meta[k] for k in ("format", "rows", "dim", "settings")}
            self.sha256 = str(meta["sha256"])
            rows, dim = int(self.info["rows"]), int(self.info["dim"])
        except Exception:
            raise DamagedShard("its metadata is not readable JSON with a checksum") from None
        self.meta = meta
        want = pa.schema([pa.field("key", pa.string()), pa.field("vector", pa.list_(pa.float32(), dim))])
        if [(f.name, f.type) for f in schema] != [(f.name, f.type) for f in want]:
            have = ", ".join(f"{f.name}: {f.type}" for f in schema)
            raise DamagedShard(f"its columns are ({have}), not key (string) and vector (fixed_size_list<float>[{dim}])")
        if reader.num_record_batches != 1:
            raise DamagedShard(f"it holds {reader.num_record_batches} record batches, not one")
        try:
            batch = reader.get_batch(0)
            batch.validate()
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            _not_damage(self.path, exc)
            raise DamagedShard(f"unreadable Arrow IPC file: {type(exc).__name__}: {exc}") from None
        keys, vec = batch.column(0), batch.column(1)
        n = batch.num_rows
        if n != rows:
            raise DamagedShard(
                f"it holds {n} keys and vectors of shape ({n}, {dim}), but its metadata says {rows} x {dim}"
            )
        if keys.null_count or vec.null_count or vec.values.null_count:
            raise DamagedShard("it holds missing (null) keys or vectors")
        flat = vec.values.to_numpy(zero_copy_only=True)[vec.offset * dim : (vec.offset + n) * dim]
        self.keys: pa.StringArray = keys
        self.vectors: np.ndarray = flat.reshape(n, dim)
        self.rows, self.dim = n, dim

    def verify(self) -> None:
        """Check the checksum and that every value is finite (reads the whole file)."""
        if _checksum(self.info, self.keys, self.vectors) != self.sha256:
            raise DamagedShard("checksum mismatch")
        bad = 0
        for start in range(0, self.rows, 65536):  # in blocks: no full-size temporary
            bad += int((~np.isfinite(self.vectors[start : start + 65536])).sum())
        if bad:
            raise DamagedShard(f"{bad} NaN or infinite values")

    def key_list(self) -> list[str]:
        return self.keys.to_pylist()


def _not_damage(path: Path, exc: BaseException) -> None:
    """Raise :class:`~posfair.runtime.errors.PosfairReadError` when ``exc`` is the operating system's (an OSError with an
    errno); Arrow's complaints about the bytes it parses (ArrowInvalid, or an OSError without an errno, e.g.
    "Invalid IPC message: negative metadata length") return, and the caller calls the shard damaged."""
    if isinstance(exc, OSError) and exc.errno is not None:
        raise PosfairReadError(path, exc) from exc


def read_shard(path: str | os.PathLike) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    """``(keys, vectors, meta)`` of a shard file after a full check (structure, checksum, finite values);
    raises :class:`DamagedShard`.  Vectors of an Arrow shard are a memory-mapped view of the file."""
    shard = ShardFile(Path(path))
    shard.verify()
    return shard.key_list(), shard.vectors, shard.meta


def set_aside(
    path: str | os.PathLike, reason: str, what: str = "cache shard", then: str = "its vectors are recomputed"
) -> Path | None:
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
    warnings.warn(
        f"damaged {what} {path} ({reason}): moved to {target}; {then}",
        DamagedShardWarning,
        stacklevel=user_stacklevel(),
    )
    return target
