"""posfair.corpus: topic-aligned multilingual segment corpora.

* :func:`load_corpus` reads the bundled Debian-documentation corpus, JSONL/Parquet
  files, ``datasets`` save_to_disk folders or Hugging Face datasets, and validates them
  (:class:`CorpusError` names the field and rows at fault).
* :mod:`posfair.corpus.filters` holds token counting and the length rules of the papers
  (length window scaled to the model limit, +-70% of the reference language).
* :func:`read_corpus_texts` reads the texts to embed from a corpus, a plain .parquet /
  .jsonl column or (:func:`read_benchmark_texts`) a benchmark in PosIR's layout
  (:mod:`posfair.corpus.posir_layout`, which reads that layout's tables: :func:`read_posir`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.corpus.aligned import (  # noqa: F401
        REQUIRED_FIELDS,
        CorpusError,
        bundled_corpus_path,
        corpus_content_fingerprint,
        load_corpus,
        validate_corpus,
    )
    from posfair.corpus.filters import (  # noqa: F401
        default_length_window,
        filter_by_length,
        filter_by_reference_length,
        token_lengths,
        topics_in_all,
    )
    from posfair.corpus.posir_layout import posir_lang, read_posir  # noqa: F401
    from posfair.corpus.texts import read_benchmark_texts, read_corpus_texts  # noqa: F401

_EXPORTS = {
    "REQUIRED_FIELDS": ".aligned",
    "CorpusError": ".aligned",
    "bundled_corpus_path": ".aligned",
    "corpus_content_fingerprint": ".aligned",
    "load_corpus": ".aligned",
    "validate_corpus": ".aligned",
    "default_length_window": ".filters",
    "filter_by_length": ".filters",
    "filter_by_reference_length": ".filters",
    "token_lengths": ".filters",
    "topics_in_all": ".filters",
    "posir_lang": ".posir_layout",
    "read_posir": ".posir_layout",
    "read_benchmark_texts": ".texts",
    "read_corpus_texts": ".texts",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.corpus", _EXPORTS)
