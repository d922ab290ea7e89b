"""The manifest: the one settings check of every command that opens a store namespace.

``manifest.json`` records the settings of a namespace (its metadata, the vector
dimension, posfair's version and a hash of the code that computes embeddings;
``posfair embed`` adds the corpora).  :func:`open_namespace_dir` compares a run's
settings with it and with every shard's own record, and raises
:class:`ManifestMismatch` naming the folder and the setting; a missing manifest is
rebuilt from the shards' own metadata.  :func:`write_manifest` is the one writer of a
manifest, whoever calls it (a run opening a namespace, ``posfair verify`` rebuilding a lost
one, ``posfair embed`` recording a corpus): every manifest it writes carries the settings
that are always compared (format, namespace, posfair version, code hash).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from posfair.files.atomic import atomic_write_json
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store.keyindex import ShardSet, _record, key_hashes, load_index, unchanged
from posfair.store.settings import MANIFEST, MANIFEST_FORMAT, canonical
from posfair.store.shards import (
    SHARD_SUFFIX,
    DamagedShard,
    ShardFile,
    reading,
    set_aside,
)

__all__ = ["ManifestMismatch", "open_namespace_dir", "rebuilt_settings", "scan_namespace", "write_manifest"]

# settings that must be recorded and equal; the others are compared when both sides know them
_STRICT = ("format", "namespace", "posfair_version", "code_hash")
# recorded only, never compared ("model" is the name given on the command line: the same model under another path,
# copied or renamed, has the same fingerprint, which hashes content only (posfair.model.info.model_fingerprint))
_RECORDED = ("model", "corpora")


class ManifestMismatch(PosfairInputError):
    """A run's settings disagree with the vectors already in a store namespace; nothing was written."""


def _diffs(
    have: dict[str, Any], want: dict[str, Any], keys: Iterable[str], have_name: str, want_name: str
) -> list[str]:
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


def write_manifest(ns_dir: str | os.PathLike, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write ``manifest.json`` of a namespace folder atomically: the one writer of a manifest.

    The manifest is written in the current format (``format`` is set when absent); one that
    lacks another always-compared setting (namespace, posfair version, code hash) is refused
    with ValueError, so no caller can leave a manifest that the next run cannot match.
    Returns what was written.
    """
    manifest = canonical({"format": MANIFEST_FORMAT, **manifest})
    missing = [k for k in _STRICT if manifest.get(k) is None]
    if missing:
        raise ValueError(f"refusing to write {Path(ns_dir) / MANIFEST} without {', '.join(missing)}")
    atomic_write_json(Path(ns_dir) / MANIFEST, manifest)
    return manifest


def rebuilt_settings(shard_settings: dict[str, Any]) -> dict[str, Any]:
    """The settings to check a namespace with when its manifest is lost: what a shard records
    (namespace, fingerprint, calibration, prompt, posfair version, code hash), in the current
    manifest format."""
    return canonical({"format": MANIFEST_FORMAT, **shard_settings})


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The stored manifest, or None when it is missing; an unreadable one, or one without the
    always-compared settings (as ``posfair verify`` once wrote when it rebuilt one), is set
    aside (kept, renamed) and None returned, so it is rebuilt from the shards."""
    if not path.exists():
        return None
    try:
        with reading(path):  # too many open files, permission, an I/O error: an error, not an unreadable manifest
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        have = json.loads(text)
        if not isinstance(have, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in _STRICT if have.get(k) is None]
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        return have
    except (ValueError, UnicodeDecodeError) as exc:
        set_aside(path, f"not readable: {exc}", what="store manifest", then="it is rebuilt from the shards")
        return None


def _check_shard(
    path: Path,
    own_settings: dict[str, Any],
    dim: int,
    manifest: dict[str, Any] | None,
    settings: dict[str, Any],
    ns_dir: Path,
) -> dict[str, Any]:
    """The shard's settings against the manifest (or this run's settings); returns the manifest, rebuilt from
    the shard when there was none."""
    own = {**own_settings, "dim": dim}
    reference = manifest if manifest is not None else settings
    diffs = _diffs(reference, own, list(own), "the store" if manifest is not None else "this run", "the shard")
    if diffs:
        raise _mismatch(f"shard {path}", diffs, ns_dir)
    if manifest is None:  # rebuild the manifest from the first good shard
        return {**settings, **{k: v for k, v in own.items() if v is not None}}
    if manifest.get("dim") is None:
        manifest["dim"] = dim
    return manifest


def scan_namespace(
    ns_dir: str | os.PathLike, settings: dict[str, Any], write: bool = True, full: bool = False
) -> tuple[dict[str, Any], ShardSet]:
    """Check a namespace folder against a run's ``settings``; check its shards; load (or rebuild) its key index.

    The one check of every command that reads or writes a store namespace (audit,
    retrieval, sweep, tune, encode, embed):

    * ``manifest.json`` must agree with ``settings`` (:func:`run_settings`), else
      :class:`ManifestMismatch` naming the folder and the setting, before any shard
      is touched;
    * every shard ``part-*.arrow`` is checked by the rule of :mod:`posfair.store.keyindex`
      (fully verified when the index does not record it unchanged, or with ``full``);
      a damaged one is set aside (:func:`set_aside`) and skipped, so its keys count as
      missing; one made with other settings raises :class:`ManifestMismatch` naming it;
      one the system would not open raises :class:`~posfair.runtime.errors.PosfairReadError`
      (nothing set aside); one gone since the folder was listed is skipped;
    * a missing manifest is rebuilt from the shards' own metadata (with a warning);
    * the key index is rebuilt (and written atomically) when it is missing or stale.

    Returns the manifest (the stored one completed with what this run knows, written
    back when it changed and ``write``) and the :class:`ShardSet` of the good shards.
    """
    ns_dir = Path(ns_dir)
    settings = canonical(settings)
    mpath = ns_dir / MANIFEST
    have = read_manifest(mpath)
    if have is not None:
        diffs = _diffs(have, settings, _ordered(settings, have), "the store", "this run")
        if diffs:
            raise _mismatch(f"store {ns_dir}", diffs, ns_dir)
        manifest = dict(have)
    else:
        manifest = None
    old = load_index(ns_dir)
    known = {rec["name"]: rec for rec in old.records} if old is not None else {}
    records: list[dict[str, Any]] = []
    fresh: dict[str, np.ndarray] = {}  # the key hashes of each shard verified now (the shard itself is not kept)
    for f in sorted(ns_dir.glob(f"part-*{SHARD_SUFFIX}")):
        rec = known.get(f.name)
        if rec is None or full or not unchanged(rec, f):
            try:
                shard = ShardFile(f)
                shard.verify()
                rec = _record(f, shard)
            except FileNotFoundError:  # gone since the listing (another process set it aside)
                continue
            except DamagedShard as exc:
                set_aside(f, str(exc))
                continue
            fresh[f.name] = key_hashes(shard.keys)
            del shard  # no mapping kept: a namespace of any number of shards is checked within the system's limits
        manifest = _check_shard(f, rec["settings"], rec["dim"], manifest, settings, ns_dir)
        records.append(rec)
    if have is None and records:
        warnings.warn(
            f"store {ns_dir} had no readable {MANIFEST}: rebuilt it from the metadata of its {len(records)} shards",
            stacklevel=user_stacklevel(),
        )
    if old is not None and not fresh and [r["name"] for r in records] == [r["name"] for r in old.records]:
        shards = ShardSet(ns_dir, old)
    else:
        shards = ShardSet.build(ns_dir, records, old, fresh)
        if records or old is not None:
            shards.save()
    manifest = manifest if manifest is not None else dict(settings)
    for k, v in settings.items():  # complete it with what this run knows
        if v is not None and (manifest.get(k) is None or k not in _RECORDED):
            manifest[k] = v
    if write and manifest != have:
        manifest = write_manifest(ns_dir, manifest)
    return manifest, shards


def open_namespace_dir(
    ns_dir: str | os.PathLike,
    settings: dict[str, Any],
    on_shard: Callable[[str, list[str], np.ndarray], None] | None = None,
    seen: Iterable[str] = (),
    write: bool = True,
) -> dict[str, Any]:
    """:func:`scan_namespace`, returning the manifest; ``on_shard(name, keys, vectors)`` gets each good
    shard not named in ``seen`` (its vectors memory-mapped)."""
    manifest, shards = scan_namespace(ns_dir, settings, write=write)
    if on_shard is not None:
        seen = set(seen)
        for i, shard in shards:
            name = shards.records[i]["name"]
            if name not in seen:
                on_shard(name, shard.key_list(), shard.vectors)
    return manifest
