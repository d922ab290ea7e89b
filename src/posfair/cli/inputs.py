"""What several commands load the same way: ``--corpus``, segment-set documents, a benchmark's size line.

A CLI-internal module (no command): the commands import it, never each other.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_documents", "load_corpus", "say_benchmark_size"]


def load_corpus(corpus: str | None, langs: list[str] | None = None, **kwargs: Any):
    """``--corpus`` loaded (with the languages the command needs); CorpusError names the file, field, rows or languages."""
    from posfair.corpus import load_corpus as load

    return load(None if corpus in (None, "bundled") else corpus, langs=langs or None, **kwargs)


def build_documents(model, corpus, lang: str, n: int, max_docs: int, seed: int = 0):
    """Monolingual segment-set documents (the audit's builder): all orderings of random sets."""
    from posfair.encoding import model_tokenizer
    from posfair.fairness.documents import LanguageConfig, build_instance, prepare_corpus

    inst = build_instance(
        prepare_corpus(corpus),
        n,
        LanguageConfig.mono(lang),
        tokenizer=model_tokenizer(model),
        limit=int(model.max_seq_length),
        target_docs=max_docs,
        seed=seed,
    )
    return inst.documents[:max_docs]


def say_benchmark_size(bench) -> None:
    """The benchmark's size and resolution, and a warning when it is too small to separate methods."""
    import warnings

    from posfair.cli.terminal import say
    from posfair.retrieval.benchmarks import BenchmarkSizeWarning

    size = bench.size()
    say(size.line())
    message = size.warning("build a larger one (posfair build-benchmark --help)")
    if message:
        warnings.warn(message, BenchmarkSizeWarning, stacklevel=1)
