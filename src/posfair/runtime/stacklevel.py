"""Where posfair's warnings point: the caller's line, not posfair's own files.

``warnings.warn(message, Category, stacklevel=user_stacklevel())`` attributes a warning to the
first frame outside posfair's library code and the libraries posfair runs under (sentence-transformers,
transformers, torch, MTEB, datasets), so ``python -W error`` tracebacks, warning filters by module and the
``file:line`` Python prints name the user's line that called posfair (a script's ``model.encode(...)`` or
``mteb.evaluate(...)``), not ``posfair/fairness/pipeline.py``.  Frames of the command line (``posfair.cli``)
count as the caller: a command's warnings are printed as one line by
:func:`posfair.cli.error_boundary.one_line_warnings`, which shows only posfair's own.
"""

from __future__ import annotations

import sys

__all__ = ["user_stacklevel"]

#: the packages whose frames a warning skips: posfair's library and the libraries that call into it
_LIBRARIES = frozenset({"posfair", "sentence_transformers", "transformers", "torch", "mteb", "datasets"})


def _library(module: str) -> bool:
    top = module.partition(".")[0]
    return top in _LIBRARIES and not (module == "posfair.cli" or module.startswith("posfair.cli."))


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the calling function point at the first frame outside
    posfair's library code (and the libraries it runs under); the outermost frame when the whole stack is theirs."""
    frame = sys._getframe(1)  # the function that will call warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None and _library(str(frame.f_globals.get("__name__", ""))):
        frame = frame.f_back
        level += 1
    return level
