"""The corpus part of a job's manifest: which corpora a namespace was built from.

The settings check itself is the store's (:func:`posfair.store.scan_namespace`, the
same one every command runs); a job adds the corpus it embeds, identified by
:func:`corpus_fingerprint`, and refuses another corpus unless asked to add it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from posfair.store import ManifestMismatch

__all__ = ["corpus_fingerprint", "record_corpus"]


def corpus_fingerprint(keys: Iterable[str]) -> str:
    """Content identity of a corpus: a hash of its sorted distinct text keys (order-independent)."""
    h = hashlib.sha256()
    for k in sorted(set(keys)):
        h.update(k.encode("ascii"))
    return h.hexdigest()[:24]


def record_corpus(
    ns_dir: Path, manifest: dict[str, Any], corpus: dict[str, Any], covered: bool, add_corpus: bool
) -> dict[str, Any]:
    """The manifest with this run's corpus recorded; raises ManifestMismatch for another corpus.

    ``corpus``: ``{"fingerprint", "source", "texts"}``.  ``covered``: every text of this
    corpus is in the store already (nothing would be written).  A manifest without
    corpora (made by another command, or rebuilt from the shards) takes this one.
    """
    corpora = list(manifest.get("corpora") or [])
    if all(c.get("fingerprint") != corpus["fingerprint"] for c in corpora) and (not covered or not corpora):
        if corpora and not add_corpus:
            known = ", ".join(f"{c.get('fingerprint')} ({c.get('source')}, {c.get('texts')} texts)" for c in corpora)
            raise ManifestMismatch(
                f"{ns_dir} was built from another corpus ({known}); this corpus is {corpus['fingerprint']} "
                f"({corpus['source']}, {corpus['texts']} texts). Pass --add-corpus (add_corpus=True) to add it to the "
                "same store, or use another --out"
            )
        corpora.append(corpus)
    return {**manifest, "corpora": corpora}
