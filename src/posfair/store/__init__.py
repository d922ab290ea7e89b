"""A content-addressed, crash-safe, self-checking embedding cache.

Layout of a store root::

    ROOT/
      <namespace-id>/            one per (model fingerprint, calibration, kind, ...)
        meta.json               the namespace's defining metadata (written once, atomically)
        manifest.json           the settings the vectors were made with (see below)
        part-<id>.npz           shards: ``keys`` (unicode), ``vectors`` (float32, n x d) and
                                ``meta`` (JSON: row count, dimension, settings, sha256 checksum)

Every shard is written to a temporary file and renamed into place, so a run
killed at any moment leaves only complete shards; the next run reads them and
computes only what is missing.  Shards are plain NumPy arrays read with
``allow_pickle=False`` (no pickle anywhere).

Every shard carries a checksum over its keys, vectors and metadata.  A shard
that cannot be read, has no checksum, fails it, or holds vectors that are not
finite float32 rows of the namespace's dimension is *damaged*: it is renamed
``part-<id>.npz.damaged-<n>`` in the same folder (never deleted), named in a
:class:`DamagedShardWarning`, and its keys are computed again.

``manifest.json`` records the settings of the namespace (its metadata, the
vector dimension, posfair's version and a hash of the code that computes
embeddings; ``posfair embed`` adds the corpora).  :func:`open_namespace_dir` is
the one check every command runs when it opens a namespace: settings that
disagree with the manifest, or a shard made with other settings, raise
:class:`ManifestMismatch` naming the folder and the setting.  A missing
manifest is rebuilt from the shards' own metadata (with a warning).

Keys are caller-chosen strings; :func:`text_key` gives the usual one (sha256 of
the text, plus any prefix such as a prompt).

Modules: :mod:`~posfair.store.settings` (what a run records), :mod:`~posfair.store.shards`
(shard files, checksums, damaged files), :mod:`~posfair.store.manifest` (the settings
check), :mod:`~posfair.store.namespace` (namespaces and the store).
"""

from posfair.store.manifest import ManifestMismatch, open_namespace_dir
from posfair.store.namespace import EmbeddingStore, Namespace, embedding_namespace, text_key
from posfair.store.settings import (
    MANIFEST,
    MANIFEST_FORMAT,
    STOCK,
    calibration_tag,
    code_version,
    embedding_meta,
    embedding_settings,
    run_settings,
)
from posfair.store.shards import SHARD_FORMAT, DamagedShard, DamagedShardWarning, read_shard, set_aside, write_shard

__all__ = [
    "EmbeddingStore",
    "Namespace",
    "ManifestMismatch",
    "DamagedShardWarning",
    "DamagedShard",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "SHARD_FORMAT",
    "write_shard",
    "read_shard",
    "set_aside",
    "open_namespace_dir",
    "run_settings",
    "code_version",
    "embedding_meta",
    "embedding_settings",
    "text_key",
    "embedding_namespace",
    "calibration_tag",
    "STOCK",
]
