"""The MTEB retrieval task over a posfair benchmark, and :func:`tasks`, which makes it.

:class:`PositionalRetrievalTask` is an ``AbsTaskRetrieval`` whose data comes from a
:class:`~posfair.retrieval.benchmarks.RetrievalBenchmark` in memory (nothing is read
from the hub): one ``hf_subset`` per positional group (:mod:`posfair.mteb.subsets`),
each with the whole corpus, its group's queries and their qrels (the benchmark's integer scores, graded as
posfair's evaluator grades them); with several domains
every query is ranked only against its own domain's documents (MTEB's ``top_ranked``).
Task names carry a hash of the benchmark's content (:func:`benchmark_digest`), so MTEB's
result cache never mixes two benchmarks.  A FairModel given to ``mteb.evaluate``
directly is evaluated through :func:`posfair.mteb.protocol.encoder` (see the package
docs, :mod:`posfair.mteb`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.languages import check_language_code
from mteb.models import SentenceTransformerEncoderWrapper

from posfair.calibration import MODEL_DEFAULT
from posfair.encoding.evaluator_base import metric_name_part
from posfair.model import FairModel
from posfair.mteb.exact_search import searcher
from posfair.mteb.protocol import PositionalEncoder
from posfair.mteb.subsets import (
    _BIN,
    _BUCKET,
    _QUERIES,
    _SUBSETS,
    MAIN_SCORE,
    SPLIT,
    _group_subsets,
    _relpos_subsets,
    _Subset,
)
from posfair.retrieval.benchmarks import RetrievalBenchmark, load_benchmark, posir_lang
from posfair.retrieval.groups import relpos_bin
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel

logger = logging.getLogger(__name__)

#: ``grouping`` values of :func:`tasks`
GROUPINGS = ("auto", "groups", "relpos", "both")
# benchmarks whose queries and passages are English (their loaders record no language)
_ENGLISH = ("squad-posq", "fineweb-posq")


class PositionalRetrievalTask(AbsTaskRetrieval):
    """An MTEB retrieval task over one posfair benchmark: one ``hf_subset`` per positional group.

    Made by :func:`tasks` (each call creates a subclass carrying the task's
    ``TaskMetadata``, as MTEB tasks declare it on the class).  The data comes from
    the :class:`RetrievalBenchmark` in memory each time MTEB loads it; every subset has
    the whole corpus and its group's queries, with their qrels (integer scores > 0).

    Attributes:
        benchmark: the benchmark.
        grouping: ``"groups"`` (the benchmark's groups) or ``"relpos"`` (PosIR length
            bucket x relative-position bin).
        subsets: the subset name -> its queries, in report order.
        group_labels: every group of the benchmark in its order, including groups
            without queries (which have no subset); ``"groups"`` only.
    """

    def __init__(
        self,
        benchmark: RetrievalBenchmark,
        grouping: str,
        subsets: Sequence[_Subset],
        group_labels: Sequence[str] = (),
        **kwargs: Any,
    ):
        self.benchmark = benchmark
        self.grouping = grouping
        self.subsets = {s.name: s for s in subsets}
        self.group_labels = tuple(group_labels)
        super().__init__(**kwargs)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        """Build MTEB's ``dataset[subset]["test"]`` (corpus, queries, qrels, per-domain candidates) from the benchmark."""
        if self.data_loaded:
            return
        b = self.benchmark
        domains = b.corpus_domains if b.corpus_domains is not None and len(set(b.corpus_domains)) > 1 else None
        # document ids are unique within a domain: prefix them with it when the corpus has several
        doc_ids = (
            list(b.corpus_ids) if domains is None else [f"{d}/{i}" for d, i in zip(domains, b.corpus_ids, strict=True)]
        )
        corpus = Dataset.from_dict({"id": doc_ids, "text": list(b.corpus_texts)})
        candidates: dict[str, list[str]] = {}
        if domains is not None:
            for d, did in zip(domains, doc_ids, strict=True):
                candidates.setdefault(d, []).append(did)
        self.dataset = {}
        for s in self.subsets.values():
            qids = [b.query_ids[i] for i in s.queries]
            queries = Dataset.from_dict({"id": qids, "text": [b.query_texts[i] for i in s.queries]})
            # graded: the qrels score of each relevant document (integers: tasks() refuses fractional scores)
            relevant = {
                qid: {doc_ids[j]: int(g) for j, g in zip(b.relevant[i], b.gains[i], strict=True)}
                for qid, i in zip(qids, s.queries, strict=True)
            }
            top_ranked = None
            if domains is not None:  # each query is ranked against its own domain's documents only
                top_ranked = {qid: candidates[b.query_domains[i]] for qid, i in zip(qids, s.queries, strict=True)}
            self.dataset[s.name] = {
                SPLIT: {"corpus": corpus, "queries": queries, "relevant_docs": relevant, "top_ranked": top_ranked}
            }
        self.data_loaded = True

    _direct: tuple[Any, Any] | None = None  # (MTEB's wrapper of a FairModel, the posfair encoder standing in for it)

    def _evaluate_subset(self, model: Any, data_split: Any, **kwargs: Any) -> Any:
        # the corpus reaches the model in MTEB's document format without MTEB's converting map (and its progress
        # bar, drawn whatever show_progress_bar says): posfair.mteb.exact_search
        return super()._evaluate_subset(searcher(self._posfair_encoder(model)), data_split, **kwargs)

    def _posfair_encoder(self, model: Any) -> Any:
        """A FairModel given to ``mteb.evaluate`` directly arrives in MTEB's SentenceTransformer wrapper,
        which would encode queries with the model's default calibration too: on posfair's tasks it is
        evaluated through :func:`encoder` instead (posfair's protocol: documents with its default
        calibration, queries stock), with its prompts and MTEB's record of it.  Other MTEB tasks use
        MTEB's wrapper as usual (``FairModel.encode_query`` / ``encode_document`` are
        sentence-transformers')."""
        inner = getattr(model, "model", None)
        if (
            not isinstance(model, SentenceTransformerEncoderWrapper)
            or isinstance(model, PositionalEncoder)
            or not isinstance(inner, FairModel)
        ):
            return model
        if self._direct is None or self._direct[0] is not model:
            with warnings.catch_warnings():  # MTEB's wrapper has already said what it had to say about the prompts
                warnings.simplefilter("ignore")
                stand_in = PositionalEncoder(inner, MODEL_DEFAULT)
            stand_in.model_prompts = model.model_prompts
            stand_in.mteb_model_meta = model.mteb_model_meta
            self._direct = (model, stand_in)
            logger.info(
                "%s: evaluating the FairModel through posfair.mteb.encoder (documents: %s, queries: stock)",
                self.metadata.name,
                inner.calibration,
            )
        return self._direct[1]

    def unload_data(self) -> None:
        self._direct = None  # the stand-in encoder holds the model and its embeddings
        super().unload_data()

    def task_specific_scores(
        self, scores: dict[str, dict[str, float]], qrels: Any, results: Any, hf_split: str, hf_subset: str
    ) -> dict[str, float]:
        """posfair's bookkeeping beside MTEB's scores: queries scored, subsets declared, bucket and bin."""
        out = {_QUERIES: float(len(scores)), _SUBSETS: float(len(self.subsets))}
        s = self.subsets.get(hf_subset)
        if s is not None and s.bin is not None:
            out[_BUCKET] = float(s.bucket)
            out[_BIN] = float(s.bin)
        return out


def benchmark_digest(benchmark: RetrievalBenchmark) -> str:
    """A sha256 of everything that decides a benchmark's scores: corpus, queries, domains, qrels, groups,
    length buckets and relative-position bins (the task's ``dataset["revision"]`` and part of its name)."""
    b = benchmark
    h = hashlib.sha256()
    parts: list[Any] = [
        b.corpus_ids,
        b.corpus_texts,
        b.corpus_domains,
        b.query_ids,
        b.query_texts,
        b.query_domains,
        {q: {d: _json_score(s) for d, s in r.items()} for q, r in b.qrels.items()},
        {g: np.flatnonzero(m).tolist() for g, m in b.groups.items()},
        b.length_bucket,
        None if b.relpos is None else relpos_bin(b.relpos).tolist(),
    ]
    for part in parts:
        h.update(json.dumps(part, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _json_score(score: Any) -> int | float:
    """A qrels score as the digest records it: an integer when it is one (1.0 -> 1), else the number."""
    value = float(score)
    return int(value) if value.is_integer() else value


def _integer_scores(b: RetrievalBenchmark) -> None:
    """PosfairInputError unless every relevant qrels score is an integer: MTEB scores with pytrec_eval, which
    takes integer relevance only."""
    for qid, rel, gains in zip(b.query_ids, b.relevant, b.gains, strict=True):
        for j, g in zip(rel, gains, strict=True):
            if not float(g).is_integer():
                raise PosfairInputError(
                    f"benchmark {b.name!r}: query {qid!r}, document {b.corpus_ids[j]!r} has qrels score {g:g}: MTEB "
                    "scores with pytrec_eval, which takes integer relevance scores only (posfair's own evaluator, "
                    "posfair retrieval, takes any finite score)"
                )


def _load(source: Any, **load_kwargs: Any) -> RetrievalBenchmark:
    if isinstance(source, RetrievalBenchmark):
        return source
    if not isinstance(source, (str, Path)):
        raise PosfairInputError(
            f"benchmark_or_source must be a RetrievalBenchmark, a benchmark name or a path; got {type(source).__name__} {source!r}"
        )
    try:
        return load_benchmark(str(source), **load_kwargs)
    except PosfairInputError:
        raise
    except ValueError as exc:  # load_benchmark's ValueErrors name the source and what is wrong with it
        raise PosfairInputError(str(exc)) from exc


def _languages(b: RetrievalBenchmark, languages: Sequence[str] | None) -> list[str]:
    """MTEB language codes of the benchmark (queries' language, then the corpus's when it differs)."""
    if languages is None:
        found = [b.meta.get("lang"), b.meta.get("corpus_lang")]
        languages = [x for x in found if x]
        if not languages and b.name.lower().startswith(_ENGLISH):
            languages = ["eng-Latn"]
        if not languages:
            raise PosfairInputError(f"benchmark {b.name!r} records no language: pass languages=['eng-Latn', ...]")
    if isinstance(languages, str) or not languages:
        raise PosfairInputError(f"languages must be a non-empty list of codes such as ['eng-Latn']; got {languages!r}")
    out: list[str] = []
    for code in languages:
        try:
            code = posir_lang(code)  # "en" -> "eng-Latn"; MTEB codes pass through
        except ValueError:
            pass
        try:
            check_language_code(code)
        except ValueError as exc:
            raise PosfairInputError(
                f"language {code!r} is not an ISO 639-3 code with a script such as 'eng-Latn': {exc}"
            ) from exc
        if code not in out:
            out.append(code)
    return out


def tasks(
    benchmark_or_source: RetrievalBenchmark | str | Path,
    *,
    grouping: str = "auto",
    name: str | None = None,
    languages: Sequence[str] | None = None,
    lang: str | None = None,
    corpus_lang: str | None = None,
    domains: Sequence[str] | None = None,
    convention: str = "inclusive",
) -> list[PositionalRetrievalTask]:
    """MTEB retrieval tasks of a posfair benchmark, one ``hf_subset`` per positional group; no hub access.

    Args:
        benchmark_or_source: a :class:`RetrievalBenchmark`, or what
            :func:`~posfair.retrieval.benchmarks.load_benchmark` accepts (a folder built by
            :func:`~posfair.retrieval.benchmarks.build_from_corpus`, a local PosIR tree, a
            local SQuAD-PosQ or FineWeb-PosQ copy; a published name or hub id is downloaded
            by ``datasets`` as ``load_benchmark`` does).
        grouping: ``"groups"`` (one subset per group of the benchmark), ``"relpos"`` (PosIR:
            one subset per length bucket and relative-position bin), ``"both"`` (one task of
            each) or ``"auto"`` (default: groups when the benchmark has any, else relpos).
        name: the task name's prefix (default ``Posfair-<benchmark name>``); the grouping and
            a hash of the benchmark's content (:func:`benchmark_digest`) are always appended,
            so MTEB's result cache never mixes two benchmarks.
        languages: MTEB language codes (``"eng-Latn"``; posfair's ``"en"`` is converted);
            default: the languages the benchmark records (queries', then corpus's), English
            for SQuAD-PosQ and FineWeb-PosQ.
        lang, corpus_lang, domains, convention: passed to ``load_benchmark`` for a source.

    Returns:
        a list of :class:`PositionalRetrievalTask` (one; two with ``grouping="both"``) for
        ``mteb.evaluate``.  A group without queries is left out with a
        :class:`MissingGroupWarning`.

    Raises:
        PosfairInputError: an unknown grouping, a benchmark without the groups or PosIR
            columns it needs, duplicate query ids, an invalid language code or source.
    """
    b, wanted = _checked_benchmark(
        benchmark_or_source, grouping, lang=lang, corpus_lang=corpus_lang, domains=domains, convention=convention
    )
    langs = _languages(b, languages)
    _warn_padded(b)
    digest = benchmark_digest(b)
    source = str(benchmark_or_source) if isinstance(benchmark_or_source, (str, Path)) else f"posfair:{b.name}"
    return [_task(b, kind, name, langs, digest, source) for kind in wanted]


def _checked_benchmark(
    benchmark_or_source: Any, grouping: str, **load_kwargs: Any
) -> tuple[RetrievalBenchmark, tuple[str, ...]]:
    """The benchmark :func:`tasks` makes tasks of and the groupings wanted (``"auto"`` resolved); input errors for an
    unknown grouping, duplicate query ids, non-integer qrels scores and groupings the benchmark cannot give."""
    if grouping not in GROUPINGS:
        raise PosfairInputError(f"grouping must be one of {GROUPINGS}; got {grouping!r}")
    b = _load(benchmark_or_source, **load_kwargs)
    if len(set(b.query_ids)) != len(b.query_ids):
        dup = sorted(q for q, n in Counter(b.query_ids).items() if n > 1)[:5]
        raise PosfairInputError(f"benchmark {b.name!r} has duplicate query ids (MTEB keys queries by id): {dup}")
    _integer_scores(b)
    if grouping == "auto":
        grouping = "groups" if b.groups else ("relpos" if b.is_posir else "groups")
    wanted = ("groups", "relpos") if grouping == "both" else (grouping,)
    if "groups" in wanted and not b.groups:
        raise PosfairInputError(
            f"benchmark {b.name!r} has no positional groups"
            + (": use grouping='relpos' (PosIR length bucket x relative position)" if b.is_posir else "")
        )
    if "relpos" in wanted and not b.is_posir:
        raise PosfairInputError(
            f"benchmark {b.name!r} has no PosIR length buckets and relative positions: grouping='relpos' needs them"
        )
    return b, wanted


def _warn_padded(b: RetrievalBenchmark) -> None:
    """A warning when documents start or end with white space (MTEB strips it before encoding)."""
    padded = sum(1 for t in b.corpus_texts if t != t.strip())
    if padded:
        warnings.warn(
            f"benchmark {b.name!r}: {padded} of {len(b.corpus_texts)} documents start or end with white space, which MTEB strips "
            f"before encoding; their embeddings may differ from posfair's evaluator",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _task(
    b: RetrievalBenchmark, kind: str, name: str | None, langs: list[str], digest: str, source: str
) -> PositionalRetrievalTask:
    """The task of one grouping (``kind``: groups or relpos) of ``b``, named and described for MTEB."""
    labels: list[str] = []
    if kind == "groups":
        subsets, labels = _group_subsets(b)
        what = "answer-position group"
    else:
        subsets = _relpos_subsets(b)
        what = "PosIR length bucket and relative-position bin of the answer"
    if not subsets:
        raise PosfairInputError(f"benchmark {b.name!r}: no {kind} subset has any query")
    task_name = f"{metric_name_part(name) if name else 'Posfair-' + (metric_name_part(b.name) or 'benchmark')}-{kind}-{digest[:10]}"
    metadata = TaskMetadata(
        name=task_name,
        description=(
            f"posfair position-aware retrieval on {b.name} ({len(b.query_ids)} queries, {len(b.corpus_ids)} documents): "
            f"one subset per {what}; graded relevance (the qrels scores); data built in memory by posfair.mteb.tasks."
        ),
        dataset={"path": source, "revision": digest},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=[SPLIT],
        eval_langs={s.name: list(langs) for s in subsets},
        main_score=MAIN_SCORE,
        annotations_creators="derived",
        bibtex_citation="",
    )
    cls = type(f"PositionalRetrievalTask[{task_name}]", (PositionalRetrievalTask,), {"metadata": metadata})
    return cls(b, kind, subsets, labels)
