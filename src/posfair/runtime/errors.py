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
:class:`PosfairReadError` is its twin for a file the operating system would not let
posfair open or read (too many open files, permission, an I/O error): never taken for a
sign that the file's contents are bad (nothing is set aside); also exit code 1.
"""

from __future__ import annotations

import errno
import resource

__all__ = ["PosfairInputError", "PosfairReadError", "PosfairWriteError", "install_hint"]


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


class _FileError(OSError):
    """``cannot <verb> PATH: <the cause in words>``: the path and the operating system's error that stopped it."""

    verb = ""

    def __init__(self, path, cause: OSError):
        self.path, self.cause = path, cause
        super().__init__(cause.errno, f"cannot {self.verb} {path}: {self.describe(cause)}")

    @staticmethod
    def describe(cause: OSError) -> str:
        """The cause in words (the subclasses say more for the errors of their kind)."""
        return cause.strerror or str(cause)

    def __str__(self) -> str:
        return self.strerror


class PosfairWriteError(_FileError):
    """A file could not be written; the message names the path and the cause.  Nothing partial is left
    at the path (posfair writes through a temporary file and a rename)."""

    verb = "write"

    @staticmethod
    def describe(cause: OSError) -> str:
        return describe_write_failure(cause)


def describe_write_failure(exc: OSError) -> str:
    """Why a write failed, in words: the errno's meaning, or for a short write (numpy's "N requested and M
    written") what usually causes it."""
    if exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    if exc.errno in (errno.EMFILE, errno.ENFILE):  # too many open files: the limit and how to raise it
        return describe_read_failure(exc)
    text = str(exc)
    if "requested and" in text and "written" in text:
        return f"the write was cut short ({text}): the disk is full or a file-size limit was reached"
    return exc.strerror or text


class PosfairReadError(_FileError):
    """A file the operating system would not let posfair open or read (too many open files, permission denied, an
    I/O error, no memory to map it): the message names the path and the cause.  Raised where posfair would otherwise
    judge the file's contents, so an error of the machine is never taken for a damaged file (nothing is set aside)."""

    verb = "read"

    @staticmethod
    def describe(cause: OSError) -> str:
        return describe_read_failure(cause)


def describe_read_failure(exc: OSError) -> str:
    """Why a file could not be opened or read, in words; for too many open files, the limit and how to raise it."""
    if exc.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        more = 4096 if soft == resource.RLIM_INFINITY else max(4096, 2 * soft)
        return (
            f"too many open files: this process reached its open-file limit (ulimit -n: {limit}); "
            f"raise it (e.g. ulimit -n {more}) and run again"
        )
    if exc.errno == errno.ENFILE:
        return "too many open files in the system (its file table is full); close other programs and run again"
    if exc.errno == errno.ENOMEM:
        return "out of memory (or more memory maps than vm.max_map_count allows)"
    if exc.errno == errno.EIO:
        return "input/output error (a failing disk or network file system)"
    if exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    return exc.strerror or str(exc) or type(exc).__name__
