"""Run a callback right after a module has been imported (or now, if it already is).

``import posfair`` must stay light (the command line's ``--help`` does not load torch), yet a
calibrated folder must load calibrated with plain ``SentenceTransformer(path)`` /
``AutoModel.from_pretrained(path)`` once posfair is imported.  posfair therefore registers its
attention functions with transformers at the moment transformers' modelling code is
imported -- whoever imports it, in whatever order -- through a finder on ``sys.meta_path``
that wraps only the named modules' loaders.  Nothing else about importing changes, and
nothing of torch or transformers is patched: the callbacks use transformers' own
registries (see :mod:`posfair.calibration.registry`).  Which modules, and which route's hook
each runs, is the table of backends' (:func:`posfair.calibration.backends.import_hooks`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable

__all__ = ["when_imported"]

_CALLBACKS: dict[str, list[Callable[[object], None]]] = {}
_LOCK = threading.RLock()


class _Loader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, name: str) -> None:
        self._wrapped = wrapped
        self._name = name

    def create_module(self, spec):
        return self._wrapped.create_module(spec)

    def exec_module(self, module) -> None:
        self._wrapped.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, attr):  # get_code, get_source, is_package, ... of the wrapped loader
        return getattr(self._wrapped, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _CALLBACKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_FINDER = _Finder()


def _run(name: str, module) -> None:
    with _LOCK:
        callbacks = _CALLBACKS.pop(name, [])
    for callback in callbacks:
        callback(module)


def when_imported(name: str, callback: Callable[[object], None]) -> None:
    """Call ``callback(module)`` once the module ``name`` is imported (at once if it already is)."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            _CALLBACKS.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    callback(module)
