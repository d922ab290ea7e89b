"""The exception for a mistake in what a user gave posfair: a file, a value, a setting.

Library functions raise :class:`PosfairInputError` (or a subclass, e.g.
:class:`posfair.corpus.CorpusError`, :class:`posfair.store.ManifestMismatch`) when
the input cannot be used, with a message that names the file, field or value at
fault.  It is a ``ValueError``, so ``except ValueError`` keeps catching it; the
command line prints it as one ``error: ...`` line and exits with code 2, while
any other exception is reported as unexpected (exit code 1).
"""

from __future__ import annotations

__all__ = ["PosfairInputError"]


class PosfairInputError(ValueError):
    """Unusable user input; the message names what is wrong and where."""
