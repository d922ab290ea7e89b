"""The manifest: the one settings check of every command that opens a store namespace.

``manifest.json`` records the settings of a namespace (its metadata, the vector
dimension, posfair's version and a hash of the code that computes embeddings;
``posfair embed`` adds the corpora).  :func:`open_namespace_dir` compares a run's
settings with it and with every shard's own record, and raises
:class:`ManifestMismatch` naming the folder and the setting; a missing manifest is
rebuilt from the shards' own metadata.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from posfair.errors import PosfairInputError
from posfair.io import atomic_write_json
from posfair.store.settings import MANIFEST, canonical
from posfair.store.shards import DamagedShard, read_shard, set_aside

__all__ = ["ManifestMismatch", "open_namespace_dir"]

# settings that must be recorded and equal; the others are compared when both sides know them
_STRICT = ("format", "namespace", "posfair_version", "code_hash")
# recorded only, never compared ("model" is the name: the same weights under another path have the same fingerprint)
_RECORDED = ("model", "corpora")


class ManifestMismatch(PosfairInputError):
    """A run's settings disagree with the vectors already in a store namespace; nothing was written."""


def _diffs(have: dict[str, Any], want: dict[str, Any], keys: Iterable[str], have_name: str, want_name: str) -> list[str]:
    out = []
    for k in keys:
        if k in _RECORDED:
            continue
        h, w = have.get(k), want.get(k)
        if k not in _STRICT and (h is None or w is None):
            continue  # not known to one side (e.g. the dimension before the first vector)
        if h != w:
            out.append(f"{k}: {have_name} has {h!r}, {want_name} has {w!r}")
    return out


def _ordered(*dicts: dict[str, Any]) -> list[str]:
    keys: list[str] = []
    for d in dicts:
        keys.extend(k for k in d if k not in keys)
    return keys


def _mismatch(where: str, diffs: list[str], ns_dir: Path) -> ManifestMismatch:
    return ManifestMismatch(
        f"{where} was made with other settings ({'; '.join(diffs)}): refusing to mix them; "
        f"use another store folder, or delete {ns_dir} to recompute it"
    )


def _read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(have, dict):
            raise ValueError("not a JSON object")
        return have
    except (ValueError, UnicodeDecodeError) as exc:
        set_aside(path, f"not readable: {exc}", what="store manifest", then="it is rebuilt from the shards")
        return None


def open_namespace_dir(
    ns_dir: str | os.PathLike,
    settings: dict[str, Any],
    on_shard: Callable[[str, list[str], np.ndarray], None] | None = None,
    seen: Iterable[str] = (),
    write: bool = True,
) -> dict[str, Any]:
    """Check a namespace folder against a run's ``settings``; verify and read its shards.

    The one check of every command that reads or writes a store namespace (audit,
    retrieval, sweep, tune, encode, embed):

    * ``manifest.json`` must agree with ``settings`` (:func:`run_settings`), else
      :class:`ManifestMismatch` naming the folder and the setting, before any shard
      is touched;
    * every shard ``part-*.npz`` (except the file names in ``seen``) is read and
      checked (:func:`read_shard`); a damaged one is set aside (:func:`set_aside`)
      and skipped, so its keys count as missing; one made with other settings
      raises :class:`ManifestMismatch` naming it; ``on_shard(name, keys, vectors)``
      gets each good one;
    * a missing manifest is rebuilt from the shards' own metadata (with a warning).

    Returns the manifest: the stored one completed with what this run knows (the
    dimension, ...), written back when it changed and ``write``.
    """
    ns_dir = Path(ns_dir)
    settings = canonical(settings)
    mpath = ns_dir / MANIFEST
    have = _read_manifest(mpath)
    if have is not None:
        diffs = _diffs(have, settings, _ordered(settings, have), "the store", "this run")
        if diffs:
            raise _mismatch(f"store {ns_dir}", diffs, ns_dir)
        manifest = dict(have)
    else:
        manifest = None
    n_good = 0
    for f in sorted(ns_dir.glob("part-*.npz")):
        if f.name in seen:
            continue
        try:
            keys, vectors, meta = read_shard(f)
        except DamagedShard as exc:
            set_aside(f, str(exc))
            continue
        own = {**meta["settings"], "dim": meta["dim"]}
        reference = manifest if manifest is not None else settings
        diffs = _diffs(reference, own, list(own), "the store" if manifest is not None else "this run", "the shard")
        if diffs:
            raise _mismatch(f"shard {f}", diffs, ns_dir)
        if manifest is None:  # rebuild the manifest from the first good shard
            manifest = {**settings, **{k: v for k, v in own.items() if v is not None}}
        elif manifest.get("dim") is None:
            manifest["dim"] = meta["dim"]
        n_good += 1
        if on_shard is not None:
            on_shard(f.name, keys, vectors)
    if have is None and n_good:
        warnings.warn(f"store {ns_dir} had no readable {MANIFEST}: rebuilt it from the metadata of its {n_good} shards", stacklevel=2)
    manifest = manifest if manifest is not None else dict(settings)
    for k, v in settings.items():  # complete it with what this run knows
        if v is not None and (manifest.get(k) is None or k not in _RECORDED):
            manifest[k] = v
    if write and manifest != have:
        atomic_write_json(mpath, manifest)
    return manifest
