"""posfair.distributed: corpus-scale embedding into the shared embedding store, locally or on Ray.

* :mod:`posfair.distributed.batching` -- length-aware, token-budget batching and padding waste.
* :mod:`posfair.distributed.spec` -- :class:`EmbedSpec`, what a worker rebuilds the encoder from.
* :mod:`posfair.distributed.worker` -- deterministic shards and the one shard function.
* :mod:`posfair.distributed.corpus_record` -- the corpora a namespace was built from.
* :mod:`posfair.distributed.job` -- the job: plan, skip what is stored, run the shards
  locally or on Ray (:func:`embed_texts`).
* :mod:`posfair.distributed.ray_engine` -- the Ray executor.
* ``posfair embed`` (command line) is :mod:`posfair.cli.embed`.

Ray is optional (the extra ``ray``: ``pip install -e '.[ray]'`` in a clone of posfair); without it the local executor runs.
The texts of a corpus are read by :func:`posfair.corpus.read_corpus_texts` (also
importable from here).
"""

from posfair.corpus.texts import read_corpus_texts
from posfair.distributed.batching import fixed_batches, length_aware_batches, padded_tokens, padding_waste
from posfair.distributed.corpus_record import corpus_fingerprint
from posfair.distributed.job import EmbedReport, embed_texts
from posfair.distributed.ray_engine import RAY_INSTALL_HINT, ray_available
from posfair.distributed.spec import EmbedSpec
from posfair.distributed.worker import Shard, plan_shards, process_shard
from posfair.store import ManifestMismatch

__all__ = [
    "RAY_INSTALL_HINT",
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
