"""Atomic writes: a file appears whole or not at all, and whoever observes a run's writes is told of each.

Every file posfair writes goes through :func:`atomic_path` (a temporary file beside the target, flushed and renamed
onto it); :func:`observing_writes` lets :class:`~posfair.files.run_folder.RunFolder` record the files of a run."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from posfair.runtime.errors import PosfairWriteError

#: who is told of each completed write (posfair.files.run_folder.RunFolder records the files of a run), innermost last
_WRITE_OBSERVERS: ContextVar[tuple[Callable[[Path], bool], ...]] = ContextVar("posfair_write_observers", default=())


@contextlib.contextmanager
def observing_writes(observer: Callable[[Path], bool]) -> Iterator[None]:
    """Within the block (this thread or task), ``observer(path)`` is called after each completed write of
    :func:`atomic_path`; observers are asked innermost first, and the first that returns True claims the file."""
    token = _WRITE_OBSERVERS.set((*_WRITE_OBSERVERS.get(), observer))
    try:
        yield
    finally:
        _WRITE_OBSERVERS.reset(token)


def _written(path: Path) -> None:
    for observer in reversed(_WRITE_OBSERVERS.get()):
        if observer(path):
            return


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    A crash (or kill) before the rename leaves ``path`` untouched; the rename is
    atomic on POSIX, so readers see either the old file or the complete new one.  A write
    that fails (full disk, file-size limit, read-only folder) raises
    :class:`~posfair.runtime.errors.PosfairWriteError` naming ``path`` and the cause, the temporary
    file removed.
    """
    path = Path(path)
    tmp_path = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; results are ordinary files
        tmp_path = Path(tmp)
        yield tmp_path
        with open(tmp_path, "rb+") as fh:  # flush file contents to disk before the rename
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        tmp_path = None
        _written(path)
    except PosfairWriteError:
        raise
    except OSError as exc:  # a full disk, a size limit, a read-only folder: name the file and the cause
        raise PosfairWriteError(path, exc) from exc
    finally:
        if tmp_path is not None and tmp_path.exists():
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
