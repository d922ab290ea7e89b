"""A content-addressed, crash-safe, self-checking embedding cache that opens in O(shards), not O(vectors).

Layout of a store root::

    ROOT/
      <namespace-id>/            one per (model fingerprint, calibration, kind, ...)
        meta.json               the namespace's defining metadata (written once, atomically)
        manifest.json           the settings the vectors were made with (see below)
        part-<id>.arrow         shards: Arrow IPC files, columns ``key`` (string) and ``vector``
                                (fixed_size_list<float32>[dim]), schema metadata ``posfair`` (JSON:
                                row count, dimension, settings, sha256 checksum)
        index.arrow             the key index: sorted key hashes -> (shard, row), and the record of
                                each verified shard (size, mtime, checksum); rebuilt when missing/stale

Every shard is written to a temporary file, flushed and renamed into place, so a
run killed at any moment leaves only complete shards; the next run reads them and
computes only what is missing.  No pickle anywhere.  pyarrow, pandas
(``read_feather``) and Hugging Face ``datasets`` (``load_dataset("arrow", ...)``)
read a shard directly; posfair memory-maps them (``pyarrow.memory_map``), so
opening a namespace reads no vectors and holds no Python dict of its keys:
lookups binary-search the memory-mapped index (:mod:`~posfair.store.keyindex`).
A mapped shard holds no open file, and a namespace keeps a bounded number mapped,
so a store of any number of shards works under a low open-file limit (``ulimit -n``).

Every shard carries a checksum over its keys, vectors and metadata.  The
checksum rule (:mod:`~posfair.store.keyindex`): a shard is fully verified before it
enters the index (new, or its size / mtime changed, or no valid index); one the
index records unchanged is trusted at open; ``Namespace.verify()``,
:func:`verify_store` and ``posfair verify STORE`` verify all.  A trusted shard found
damaged when first read is set aside and the namespace scanned again, so the same
call computes its keys again (``get_or_compute``) or reports them missing.
A shard that cannot be read, has no checksum, fails it, or holds vectors that are
not finite float32 rows of its dimension is *damaged*: it is renamed
``part-<id>.arrow.damaged-<n>`` in the same folder (never deleted), named in a
:class:`DamagedShardWarning`, and its keys are computed again.  A file the operating
system would not open or read (too many open files, permission, an I/O error) is not
damaged: :class:`~posfair.runtime.errors.PosfairReadError` names it and the cause, and nothing
is set aside.

``manifest.json`` records the settings of the namespace (its metadata, the
vector dimension, posfair's version and a hash of the code that computes
embeddings; ``posfair embed`` adds the corpora).  :func:`scan_namespace` is
the one check every command runs when it opens a namespace: settings that
disagree with the manifest, or a shard made with other settings, raise
:class:`ManifestMismatch` naming the folder and the setting.  A missing
manifest is rebuilt from the shards' own metadata (with a warning).

Keys are caller-chosen strings; :func:`text_key` gives the usual one (sha256 of
the text, plus any prefix such as a prompt).

Modules: :mod:`~posfair.store.settings` (what a run records), :mod:`~posfair.store.shards`
(shard files, checksums, damaged files), :mod:`~posfair.store.keyindex` (the key index,
the checksum rule), :mod:`~posfair.store.manifest` (the settings check, opening a
namespace folder), :mod:`~posfair.store.namespace` (namespaces and the store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.store.keyindex import INDEX, ShardSet, key_hashes  # noqa: F401
    from posfair.store.manifest import (  # noqa: F401
        ManifestMismatch,
        open_namespace_dir,
        rebuilt_settings,
        scan_namespace,
        write_manifest,
    )
    from posfair.store.namespace import EmbeddingStore, Namespace, embedding_namespace, text_key, verify_store  # noqa: F401
    from posfair.store.settings import (  # noqa: F401
        MANIFEST,
        MANIFEST_FORMAT,
        calibration_tag,
        code_version,
        embedding_meta,
        embedding_settings,
        run_settings,
    )
    from posfair.store.shards import (  # noqa: F401
        SHARD_FORMAT,
        SHARD_SUFFIX,
        DamagedShard,
        DamagedShardWarning,
        ShardFile,
        read_shard,
        set_aside,
        shard_path,
        write_shard,
    )

_EXPORTS = {
    "INDEX": ".keyindex",
    "ShardSet": ".keyindex",
    "key_hashes": ".keyindex",
    "ManifestMismatch": ".manifest",
    "open_namespace_dir": ".manifest",
    "rebuilt_settings": ".manifest",
    "scan_namespace": ".manifest",
    "write_manifest": ".manifest",
    "EmbeddingStore": ".namespace",
    "Namespace": ".namespace",
    "embedding_namespace": ".namespace",
    "text_key": ".namespace",
    "verify_store": ".namespace",
    "MANIFEST": ".settings",
    "MANIFEST_FORMAT": ".settings",
    "calibration_tag": ".settings",
    "code_version": ".settings",
    "embedding_meta": ".settings",
    "embedding_settings": ".settings",
    "run_settings": ".settings",
    "SHARD_FORMAT": ".shards",
    "SHARD_SUFFIX": ".shards",
    "DamagedShard": ".shards",
    "DamagedShardWarning": ".shards",
    "ShardFile": ".shards",
    "read_shard": ".shards",
    "set_aside": ".shards",
    "shard_path": ".shards",
    "write_shard": ".shards",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.store", _EXPORTS)
