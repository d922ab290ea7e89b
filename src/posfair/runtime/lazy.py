"""Lazy exports for package ``__init__`` modules: names are imported from their module on first use.

So ``import posfair`` (and ``import posfair.fairness``, ``posfair.tuning`` ...) stays light --
no numpy, torch or transformers -- while ``from posfair import audit`` works.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable, Callable]:
    """``(__all__, __getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the module
    (absolute, or relative to ``package`` when it starts with ".") that defines it."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module if not module.startswith(".") else package + module), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups do not come here again
        return value

    def __dir__() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(exports))

    return sorted(exports), __getattr__, __dir__
