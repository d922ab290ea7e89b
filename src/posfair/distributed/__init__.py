"""posfair.distributed: corpus-scale embedding into the shared embedding store, locally or on Ray.

* :mod:`posfair.distributed.batching` -- length-aware, token-budget batching and padding waste.
* :mod:`posfair.distributed.job` -- deterministic shards, the shard function, the local and
  Ray executors, the manifest (:func:`embed_texts`, :func:`read_corpus_texts`).
* ``posfair embed`` (command line) is :mod:`posfair.cli.embed`.

Ray is optional (``pip install 'posfair[ray]'``); without it the local executor runs.
"""

from posfair.distributed.batching import fixed_batches, length_aware_batches, padded_tokens, padding_waste
from posfair.distributed.job import (
    EmbedReport,
    EmbedSpec,
    ManifestMismatch,
    Shard,
    corpus_fingerprint,
    embed_texts,
    plan_shards,
    process_shard,
    ray_available,
    read_corpus_texts,
)

__all__ = [
    "EmbedReport",
    "EmbedSpec",
    "ManifestMismatch",
    "Shard",
    "corpus_fingerprint",
    "embed_texts",
    "fixed_batches",
    "length_aware_batches",
    "padded_tokens",
    "padding_waste",
    "plan_shards",
    "process_shard",
    "ray_available",
    "read_corpus_texts",
]
