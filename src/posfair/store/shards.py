"""Shard files: keys + float32 vectors + metadata with a checksum, written atomically, checked on read.

A shard is a plain NumPy ``.npz`` (read with ``allow_pickle=False``): ``keys``
(unicode), ``vectors`` (float32, n x d) and ``meta`` (JSON: row count, dimension,
the settings it was made with, a sha256 over all of it).  One that cannot be read,
has no checksum, fails it, or holds non-finite or misshapen vectors raises
:class:`DamagedShard`; :func:`set_aside` renames such a file ``<name>.damaged-<n>``
(never deleting it) with a :class:`DamagedShardWarning`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posfair.io import atomic_path
from posfair.store.settings import canonical, run_settings

__all__ = ["DamagedShard", "DamagedShardWarning", "read_shard", "set_aside", "write_shard"]

SHARD_FORMAT = 2
# settings a shard records about itself (enough to rebuild the manifest from the shards)
_SHARD_SETTINGS = ("namespace", "fingerprint", "calibration", "prompt", "posfair_version", "code_hash")


class DamagedShardWarning(UserWarning):
    """A damaged cache file was found and renamed aside; its vectors are computed again."""


class DamagedShard(ValueError):
    """A shard file that cannot be trusted (unreadable, no or wrong checksum, bad shape, non-finite values)."""


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
    settings = _folder_settings(folder) if settings is None else canonical(settings)
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
