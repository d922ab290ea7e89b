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

from posfair.corpus.aligned import (
    REQUIRED_FIELDS,
    CorpusError,
    bundled_corpus_path,
    corpus_content_fingerprint,
    load_corpus,
    validate_corpus,
)
from posfair.corpus.filters import (
    default_length_window,
    filter_by_length,
    filter_by_reference_length,
    token_lengths,
    topics_in_all,
)
from posfair.corpus.posir_layout import posir_lang, read_posir
from posfair.corpus.texts import read_benchmark_texts, read_corpus_texts

__all__ = [
    "REQUIRED_FIELDS",
    "CorpusError",
    "bundled_corpus_path",
    "corpus_content_fingerprint",
    "default_length_window",
    "filter_by_length",
    "filter_by_reference_length",
    "load_corpus",
    "posir_lang",
    "read_benchmark_texts",
    "read_corpus_texts",
    "read_posir",
    "token_lengths",
    "topics_in_all",
    "validate_corpus",
]
