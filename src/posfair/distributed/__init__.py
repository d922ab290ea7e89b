"""posfair.distributed: corpus-scale embedding into the shared embedding store, locally or on Ray.

* :mod:`posfair.encoding.batching` -- length-aware, token-budget batching and padding waste (the encoding
  layer's: ``posfair serve`` batches with it too; importable from here).
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

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.corpus.texts import read_corpus_texts  # noqa: F401
    from posfair.distributed.corpus_record import corpus_fingerprint  # noqa: F401
    from posfair.distributed.job import EmbedReport, embed_texts  # noqa: F401
    from posfair.distributed.ray_engine import RAY_INSTALL_HINT, ray_available  # noqa: F401
    from posfair.distributed.spec import EmbedSpec  # noqa: F401
    from posfair.distributed.worker import Shard, plan_shards, process_shard  # noqa: F401
    from posfair.encoding.batching import fixed_batches, length_aware_batches, padded_tokens, padding_waste  # noqa: F401
    from posfair.store import ManifestMismatch  # noqa: F401

_EXPORTS = {
    "read_corpus_texts": "posfair.corpus.texts",
    "fixed_batches": "posfair.encoding.batching",
    "length_aware_batches": "posfair.encoding.batching",
    "padded_tokens": "posfair.encoding.batching",
    "padding_waste": "posfair.encoding.batching",
    "corpus_fingerprint": ".corpus_record",
    "EmbedReport": ".job",
    "embed_texts": ".job",
    "RAY_INSTALL_HINT": ".ray_engine",
    "ray_available": ".ray_engine",
    "EmbedSpec": ".spec",
    "Shard": ".worker",
    "plan_shards": ".worker",
    "process_shard": ".worker",
    "ManifestMismatch": "posfair.store",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.distributed", _EXPORTS)
