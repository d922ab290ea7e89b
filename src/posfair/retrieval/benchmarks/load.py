"""One entry point for every benchmark: a name, a hub id or a local path (layout detected)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from posfair.retrieval.benchmarks.benchmark import RetrievalBenchmark
from posfair.retrieval.benchmarks.posir import POSIR_DIR, POSIR_HUB_ID, load_posir
from posfair.retrieval.benchmarks.posq import FINEWEB_HUB_ID, SQUAD_HUB_ID, load_fineweb_posq, load_squad_posq
from posfair.retrieval.benchmarks.sources import is_local, read_splits

__all__ = ["BENCHMARK_NAMES", "HUB_BENCHMARKS", "load_benchmark"]

_NAMED = {
    "squad-posq": lambda **kw: load_squad_posq(convention=kw.get("convention", "inclusive")),
    "squad-posq-tiny": lambda **kw: load_squad_posq(sample=10_000, convention=kw.get("convention", "inclusive")),
    "fineweb-posq": lambda **kw: load_fineweb_posq(),
    "posir": lambda **kw: load_posir(
        lang=kw.get("lang") or "eng-Latn", corpus_lang=kw.get("corpus_lang"), domains=kw.get("domains")
    ),
}


def load_benchmark(
    name_or_path: str,
    *,
    lang: str | None = None,
    corpus_lang: str | None = None,
    domains: Sequence[str] | None = None,
    convention: str = "inclusive",
) -> RetrievalBenchmark:
    """A benchmark by name (``squad-posq``, ``squad-posq-tiny``, ``fineweb-posq``, ``posir``),
    by hub id, or by local path (layout detected: PosIR tree, SQuAD rows, FineWeb-PosQ rows)."""
    kw = {"lang": lang, "corpus_lang": corpus_lang, "domains": domains, "convention": convention}
    key = name_or_path.lower()
    if key in _NAMED:
        return _NAMED[key](**kw)
    if name_or_path == SQUAD_HUB_ID:
        return load_squad_posq(name_or_path, convention=convention)
    if name_or_path == FINEWEB_HUB_ID:
        return load_fineweb_posq(name_or_path)
    if name_or_path == POSIR_HUB_ID:
        return load_posir(name_or_path, lang=lang or "eng-Latn", corpus_lang=corpus_lang, domains=domains)
    if is_local(name_or_path):
        path = Path(name_or_path).expanduser()
        if path.is_dir() and any(p.is_dir() and POSIR_DIR.match(p.name) for p in path.iterdir()):
            if lang is None:
                langs = sorted(p.name for p in path.iterdir() if p.is_dir() and POSIR_DIR.match(p.name))
                lang = "eng-Latn" if "eng-Latn" in langs else langs[0]
            return load_posir(path, lang=lang, corpus_lang=corpus_lang, domains=domains)
        rows = read_splits(path, ("train", "validation"))
        if rows and "span_class" in rows[0]:
            return load_fineweb_posq(rows)
        if rows and "answers" in rows[0]:
            return load_squad_posq(rows, convention=convention)
        raise ValueError(
            f"{path}: not a PosIR tree and its rows have neither SQuAD ('answers') nor FineWeb-PosQ ('span_class') fields"
        )
    raise ValueError(
        f"unknown benchmark {name_or_path!r}: use one of {sorted(_NAMED)}, a hub id "
        f"({SQUAD_HUB_ID}, {FINEWEB_HUB_ID}, {POSIR_HUB_ID}) or an existing path"
    )


#: the benchmark names :func:`load_benchmark` knows
BENCHMARK_NAMES = tuple(sorted(_NAMED))
#: the hub datasets :func:`load_benchmark` reads by id
HUB_BENCHMARKS = (SQUAD_HUB_ID, FINEWEB_HUB_ID, POSIR_HUB_ID)
