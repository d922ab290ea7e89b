"""What a store records about a run: canonical settings, posfair's code version, the embedding namespace's definition.

:func:`run_settings` is what a run opens a namespace with (its metadata, posfair's
version and a hash of the code that computes embeddings, plus what the run knows,
e.g. the fingerprint or the dimension); the manifest check compares it
(:mod:`posfair.store.manifest`) and every shard records part of it
(:mod:`posfair.store.shards`).  :func:`embedding_meta` / :func:`embedding_settings`
define the one namespace of pooled embeddings of texts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

from posfair.calibration.choice import STOCK, Resolved, check_choice

__all__ = [
    "MANIFEST",
    "calibration_tag",
    "canonical",
    "code_version",
    "embedding_meta",
    "embedding_settings",
    "run_settings",
]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2
# the modules whose code determines an embedding (a change may change the vectors)
_CODE_MODULES = ("posfair.model", "posfair.calibration")


def canonical(obj: Any) -> Any:
    """``obj`` as JSON reads it back (sorted keys, tuples as lists, other objects as strings)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str]:
    """posfair's version and a hash of the sources that compute embeddings (model + calibration)."""
    h = hashlib.sha256()
    for name in _CODE_MODULES:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin)
        files = sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return {"posfair_version": installed_version(), "code_hash": h.hexdigest()[:16]}


def installed_version() -> str:
    """posfair's version as installed (the package metadata, from pyproject.toml); ``"0+unknown"`` when posfair runs
    from a source tree that was never installed."""
    try:
        return importlib.metadata.version("posfair")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def run_settings(meta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The settings a run opens a namespace with: its metadata, posfair's code version and ``extra``
    (e.g. fingerprint, calibration, prompt, dim; None = not known to this run)."""
    return canonical({"format": MANIFEST_FORMAT, "namespace": meta, **code_version(), **extra})


def calibration_tag(calibration: Resolved) -> str:
    """How a calibration (a Calibration or STOCK) is named in cache metadata: its stable key (``"stock"``)."""
    return check_choice(calibration, model_default=False).key()


def embedding_meta(fingerprint: str, calibration: Resolved, prompt: str | None = None) -> dict[str, Any]:
    """The metadata defining :func:`embedding_namespace` (for :meth:`EmbeddingStore.namespace_dir`)."""
    return dict(model=fingerprint, calibration=calibration_tag(calibration), kind="embedding", prompt=prompt or "")


def embedding_settings(
    fingerprint: str, calibration: Resolved, prompt: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The manifest settings of an :func:`embedding_namespace` beyond its metadata (``extra``: e.g. dim)."""
    cal = None if check_choice(calibration, model_default=False) is STOCK else calibration.to_dict()
    return dict(fingerprint=fingerprint, calibration=cal, prompt=prompt or "", **extra)
