"""Small I/O helpers: atomic writes and text-file readers shared by the CLI and the jobs."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    A crash (or kill) before the rename leaves ``path`` untouched; the rename is
    atomic on POSIX, so readers see either the old file or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; results are ordinary files
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # flush file contents to disk before the rename
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(tmp_path)`` and atomically move the result onto ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    def _w(p: Path) -> None:
        with open(p, "wb") as fh:
            np.save(fh, np.ascontiguousarray(array), allow_pickle=False)

    return atomic_write(path, _w)


def atomic_write_parquet(path: str | os.PathLike, df, **to_parquet_kwargs) -> Path:
    """Write a DataFrame as Parquet atomically (``to_parquet_kwargs``: compression=..., etc.)."""
    to_parquet_kwargs.setdefault("index", False)
    return atomic_write(path, lambda p: df.to_parquet(p, **to_parquet_kwargs))
