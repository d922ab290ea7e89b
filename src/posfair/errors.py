"""The exception for a mistake in what a user gave posfair: a file, a value, a setting.

Library functions raise :class:`PosfairInputError` (or a subclass, e.g.
:class:`posfair.corpus.CorpusError`, :class:`posfair.store.ManifestMismatch`) when
the input cannot be used, with a message that names the file, field or value at
fault.  It is a ``ValueError``, so ``except ValueError`` keeps catching it; the
command line prints it as one ``error: ...`` line and exits with code 2, while
any other exception is reported as unexpected (exit code 1).

:class:`PosfairWriteError` is a file posfair could not write (a full disk, a file-size
limit, a read-only folder): its message names the path and the cause, and the command
line prints it as one ``error: ...`` line with exit code 1 (the input was fine).
"""

from __future__ import annotations

import errno

__all__ = ["PosfairInputError", "PosfairWriteError", "install_hint"]


def install_hint(extra: str | None = None) -> str:
    """How to install posfair (with ``extra``): from a clone of its repository, as posfair is not on PyPI."""
    spec = f".[{extra}]" if extra else "."
    return f"pip install -e '{spec}' in a clone of the posfair repository (posfair is not on PyPI)"


class PosfairInputError(ValueError):
    """Unusable user input; the message names what is wrong and where."""


_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EFBIG: "file too large (a file-size limit was reached)",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class PosfairWriteError(OSError):
    """A file could not be written; the message names the path and the cause.  Nothing partial is left
    at the path (posfair writes through a temporary file and a rename)."""

    def __init__(self, path, cause: OSError):
        self.path, self.cause = path, cause
        super().__init__(cause.errno, f"cannot write {path}: {describe_write_failure(cause)}")

    def __str__(self) -> str:
        return self.strerror


def describe_write_failure(exc: OSError) -> str:
    """Why a write failed, in words: the errno's meaning, or for a short write (numpy's "N requested and M
    written") what usually causes it."""
    if exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    text = str(exc)
    if "requested and" in text and "written" in text:
        return f"the write was cut short ({text}): the disk is full or a file-size limit was reached"
    return exc.strerror or text
