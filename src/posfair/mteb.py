"""posfair's position-aware retrieval benchmarks as MTEB 2.x tasks, measured with posfair's protocol.

Three pieces, meant to be used together::

    import mteb
    import posfair.mteb

    tasks = posfair.mteb.tasks("bench")                       # a benchmark folder, name or RetrievalBenchmark
    results = mteb.evaluate(posfair.mteb.encoder(model, cal), tasks, cache=None)
    scores = posfair.mteb.position_scores(results, tasks)     # nDCG@10 per group, Harm, PSI

* :func:`tasks` turns a :class:`~posfair.retrieval.benchmarks.RetrievalBenchmark`
  (or anything :func:`~posfair.retrieval.benchmarks.load_benchmark` accepts: a
  benchmark built by :func:`~posfair.retrieval.benchmarks.build_from_corpus`, a
  local copy of PosIR, SQuAD-PosQ or FineWeb-PosQ) into MTEB retrieval tasks that
  hold their data in memory: nothing is read from the hub.
* :func:`encoder` wraps a model for MTEB with posfair's protocol: documents are
  encoded with the setting under test (stock or a :class:`~posfair.Calibration`),
  queries always with the stock model, every embedding L2-normalised and scored by
  inner product (cosine), as :class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator`
  does.  MTEB's per-group nDCG@10 then equals posfair's.
* :func:`position_scores` reads what ``mteb.evaluate`` returns and gives, per task,
  nDCG@10 per group and Harm and PSI computed with :mod:`posfair.retrieval.metrics`
  (the evaluator's own definitions).

**One MTEB subset per group.**  Each answer-position group (``seg 1``, ``seg 2``, ...
of a built benchmark, ``0+`` ... ``500+`` of SQuAD-PosQ, ``begin`` / ``middle`` /
``end`` of FineWeb-PosQ) is one ``hf_subset`` of the task's single ``test`` split,
holding the group's queries and the whole corpus.  Subsets, not splits, because
subsets are how MTEB reports parallel slices of one task: each gets its own row
(``hf_subset``) in ``TaskResult.scores["test"]``, its own ``main_score`` (nDCG@10)
and its own entry in ``to_dataframe()``, a run can be restricted to some of them, and
MTEB's aggregate (``TaskResult.get_score()``) averages them.  Splits mean
train / dev / test partitions to MTEB: results tables and leaderboards read the
evaluation split, and a task with six "test-like" splits would be reported as six
evaluation regimes of one task.  Groups may overlap (SQuAD-PosQ's inclusive bounds,
FineWeb-PosQ's multi-part answers); a query then sits in every subset of its groups,
as in posfair.  A group without queries cannot be scored by MTEB: it is left out with
a :class:`MissingGroupWarning` and reported as NaN, as posfair's evaluator does.

For PosIR-style benchmarks without groups (the published PosIR) ``grouping="relpos"``
gives one subset per (length bucket, relative-position bin) with queries, named
``Q1.bin00`` ... ``Q4.bin19``, plus ``Q1.unbinned`` ... for the queries of a bucket
without a relative position; :func:`position_scores` rebuilds posfair's per-bucket
nDCG@10 (query-weighted over the bucket's subsets) and PSI over the bins.  When a
benchmark has several domains (each with its own corpus), every query is ranked only
against its own domain's documents (MTEB's ``top_ranked`` candidates), as posfair
searches each domain separately.

**Relevance** is binary (a qrel score > 0 is relevant, gain 1), as in posfair.
MTEB strips leading and trailing white space from documents before encoding them;
:func:`tasks` warns when a document has any (its tokens, and so its embedding, may
then differ from posfair's).

**MTEB's result cache.**  ``mteb.evaluate`` stores every result under the model's
name, revision and ``experiment_kwargs`` and, by default
(``overwrite_strategy="only-missing"``), returns a stored result instead of running
again.  Task names carry a hash of the benchmark's content, so a different benchmark
never reuses another's results.  :func:`encoder` records the document setting
(``stock`` or the calibration), the stock queries and the token limit in the model's
``experiment_kwargs``, so stock and calibrated runs are stored apart.  A calibrated
:class:`~posfair.FairModel` passed to ``mteb.evaluate`` directly is known to MTEB
only by its name: pass ``cache=None`` (or ``overwrite_strategy="always"``), or MTEB
silently returns the results of an earlier stock run of the same model.

**A FairModel passed directly.**  ``mteb.evaluate(model, tasks)`` wraps a
SentenceTransformer in MTEB's own wrapper, which encodes through
``encode_query`` / ``encode_document``; a FairModel does not support those on
sentence-transformers 6.x, and they would calibrate queries as well.  posfair's tasks
therefore evaluate a FairModel that arrives that way through :func:`encoder` (its
default calibration on documents, queries stock, the prompts MTEB resolved, MTEB's
record of the model), so the protocol is the same either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.languages import check_language_code
from mteb.models import SentenceTransformerEncoderWrapper
from mteb.models.abs_encoder import get_prompt
from mteb.results import ModelResult, TaskResult
from mteb.types import PromptType
from sentence_transformers import SentenceTransformer

from posfair import compat
from posfair.calibration import Calibration
from posfair.calibration.coverage import CalibrationFallbackWarning, quiet_fallback
from posfair.encoding import embed_through, l2_normalize
from posfair.encoding import encoder as posfair_encoder
from posfair.errors import PosfairInputError
from posfair.model import FairModel, model_fingerprint
from posfair.retrieval.benchmarks import RetrievalBenchmark, load_benchmark, posir_lang
from posfair.retrieval.groups import N_RELPOS_BINS, POSIR_BUCKETS, relpos_bin
from posfair.retrieval.metrics import harmonic_mean, psi
from posfair.store import EmbeddingStore, embedding_namespace

__all__ = [
    "GROUPINGS",
    "MissingGroupWarning",
    "PositionScores",
    "PositionalEncoder",
    "PositionalRetrievalTask",
    "benchmark_digest",
    "encoder",
    "position_scores",
    "tasks",
]

logger = logging.getLogger(__name__)

#: ``grouping`` values of :func:`tasks`
GROUPINGS = ("auto", "groups", "relpos", "both")
SPLIT = "test"
MAIN_SCORE = "ndcg_at_10"
# numbers every subset's scores carry (MTEB's task-specific scores), so position_scores needs only the results
_QUERIES = "posfair_queries"  # queries MTEB scored in the subset
_SUBSETS = "posfair_subsets"  # subsets the task declares
_BUCKET = "posfair_bucket"  # relpos subsets: 1-based index into POSIR_BUCKETS
_BIN = "posfair_bin"  # relpos subsets: relative-position bin, -1 for queries without one
_UNBINNED = "unbinned"
# benchmarks whose queries and passages are English (their loaders record no language)
_ENGLISH = ("squad-posq", "fineweb-posq")


class MissingGroupWarning(UserWarning):
    """A positional group that has no queries, or that MTEB's results lack: its score is NaN, and
    Harm and PSI are over the other groups."""


# -- tasks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Subset:
    """One MTEB subset: a positional group (or a PosIR bucket's relative-position bin) and its queries."""

    name: str
    queries: tuple[int, ...]  # indices into the benchmark's queries
    bucket: int = 0  # relpos: 1-based index into POSIR_BUCKETS (0: a group)
    bin: int | None = None  # relpos: relative-position bin, -1 = none


class PositionalRetrievalTask(AbsTaskRetrieval):
    """An MTEB retrieval task over one posfair benchmark: one ``hf_subset`` per positional group.

    Made by :func:`tasks` (each call creates a subclass carrying the task's
    ``TaskMetadata``, as MTEB tasks declare it on the class).  The data comes from
    the :class:`RetrievalBenchmark` in memory each time MTEB loads it; every subset has
    the whole corpus and its group's queries, with binary qrels.

    Attributes:
        benchmark: the benchmark.
        grouping: ``"groups"`` (the benchmark's groups) or ``"relpos"`` (PosIR length
            bucket x relative-position bin).
        subsets: the subset name -> its queries, in report order.
        group_labels: every group of the benchmark in its order, including groups
            without queries (which have no subset); ``"groups"`` only.
    """

    def __init__(
        self, benchmark: RetrievalBenchmark, grouping: str, subsets: Sequence[_Subset], group_labels: Sequence[str] = (), **kwargs: Any
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
        doc_ids = list(b.corpus_ids) if domains is None else [f"{d}/{i}" for d, i in zip(domains, b.corpus_ids, strict=True)]
        corpus = Dataset.from_dict({"id": doc_ids, "text": list(b.corpus_texts)})
        candidates: dict[str, list[str]] = {}
        if domains is not None:
            for d, did in zip(domains, doc_ids, strict=True):
                candidates.setdefault(d, []).append(did)
        self.dataset = {}
        for s in self.subsets.values():
            qids = [b.query_ids[i] for i in s.queries]
            queries = Dataset.from_dict({"id": qids, "text": [b.query_texts[i] for i in s.queries]})
            relevant = {qid: {doc_ids[j]: 1 for j in b.relevant[i]} for qid, i in zip(qids, s.queries, strict=True)}
            top_ranked = None
            if domains is not None:  # each query is ranked against its own domain's documents only
                top_ranked = {qid: candidates[b.query_domains[i]] for qid, i in zip(qids, s.queries, strict=True)}
            self.dataset[s.name] = {SPLIT: {"corpus": corpus, "queries": queries, "relevant_docs": relevant, "top_ranked": top_ranked}}
        self.data_loaded = True

    _direct: tuple[Any, Any] | None = None  # (MTEB's wrapper of a FairModel, the posfair encoder standing in for it)

    def _evaluate_subset(self, model: Any, data_split: Any, **kwargs: Any) -> Any:
        return super()._evaluate_subset(self._posfair_encoder(model), data_split, **kwargs)

    def _posfair_encoder(self, model: Any) -> Any:
        """A FairModel given to ``mteb.evaluate`` directly arrives in MTEB's SentenceTransformer wrapper,
        which calls ``encode_query`` / ``encode_document`` (not supported by FairModel on
        sentence-transformers 6.x, and calibrating queries too): evaluate it through :func:`encoder`
        instead, with its default calibration, its prompts and MTEB's record of it."""
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
                stand_in = PositionalEncoder(inner, "model")
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
        {q: {d: int(s) for d, s in r.items()} for q, r in b.qrels.items()},
        {g: np.flatnonzero(m).tolist() for g, m in b.groups.items()},
        b.length_bucket,
        None if b.relpos is None else relpos_bin(b.relpos).tolist(),
    ]
    for part in parts:
        h.update(json.dumps(part, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


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
            raise PosfairInputError(f"language {code!r} is not an ISO 639-3 code with a script such as 'eng-Latn': {exc}") from exc
        if code not in out:
            out.append(code)
    return out


def _group_subsets(b: RetrievalBenchmark) -> tuple[list[_Subset], list[str]]:
    subsets, labels = [], []
    for label, mask in b.groups.items():
        labels.append(label)
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            warnings.warn(
                f"benchmark {b.name!r}: group {label!r} has no queries; MTEB cannot score it, so the task has no subset "
                f"for it and position_scores reports it as NaN (Harm and PSI are over the other groups)",
                MissingGroupWarning,
                stacklevel=3,
            )
            continue
        subsets.append(_Subset(name=label, queries=tuple(int(i) for i in idx)))
    return subsets, labels


def _relpos_subsets(b: RetrievalBenchmark) -> list[_Subset]:
    bucket = np.asarray([x if x is not None else "" for x in b.length_bucket], dtype=object)
    bins = relpos_bin(b.relpos)
    subsets = []
    for k, (label, _, _) in enumerate(POSIR_BUCKETS, start=1):
        in_bucket = bucket == label
        for j in [*range(N_RELPOS_BINS), -1]:
            idx = np.flatnonzero(in_bucket & (bins == j))
            if idx.size:
                name = f"{label}.bin{j:02d}" if j >= 0 else f"{label}.{_UNBINNED}"
                subsets.append(_Subset(name=name, queries=tuple(int(i) for i in idx), bucket=k, bin=j))
    outside = int((bucket == "").sum())
    if outside:
        logger.info("benchmark %s: %d queries are in no length bucket (no relative-position subset)", b.name, outside)
    return subsets


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "benchmark"


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
    if grouping not in GROUPINGS:
        raise PosfairInputError(f"grouping must be one of {GROUPINGS}; got {grouping!r}")
    b = _load(benchmark_or_source, lang=lang, corpus_lang=corpus_lang, domains=domains, convention=convention)
    if len(set(b.query_ids)) != len(b.query_ids):
        dup = sorted(q for q, n in Counter(b.query_ids).items() if n > 1)[:5]
        raise PosfairInputError(f"benchmark {b.name!r} has duplicate query ids (MTEB keys queries by id): {dup}")
    if grouping == "auto":
        grouping = "groups" if b.groups else ("relpos" if b.is_posir else "groups")
    wanted = ("groups", "relpos") if grouping == "both" else (grouping,)
    if "groups" in wanted and not b.groups:
        raise PosfairInputError(
            f"benchmark {b.name!r} has no positional groups"
            + (": use grouping='relpos' (PosIR length bucket x relative position)" if b.is_posir else "")
        )
    if "relpos" in wanted and not b.is_posir:
        raise PosfairInputError(f"benchmark {b.name!r} has no PosIR length buckets and relative positions: grouping='relpos' needs them")
    langs = _languages(b, languages)
    padded = sum(1 for t in b.corpus_texts if t != t.strip())
    if padded:
        warnings.warn(
            f"benchmark {b.name!r}: {padded} of {len(b.corpus_texts)} documents start or end with white space, which MTEB strips "
            f"before encoding; their embeddings may differ from posfair's evaluator",
            UserWarning,
            stacklevel=2,
        )
    digest = benchmark_digest(b)
    source = str(benchmark_or_source) if isinstance(benchmark_or_source, (str, Path)) else f"posfair:{b.name}"
    out = []
    for kind in wanted:
        labels: list[str] = []
        if kind == "groups":
            subsets, labels = _group_subsets(b)
            what = "answer-position group"
        else:
            subsets = _relpos_subsets(b)
            what = "PosIR length bucket and relative-position bin of the answer"
        if not subsets:
            raise PosfairInputError(f"benchmark {b.name!r}: no {kind} subset has any query")
        task_name = f"{_slug(name) if name else 'Posfair-' + _slug(b.name)}-{kind}-{digest[:10]}"
        metadata = TaskMetadata(
            name=task_name,
            description=(
                f"posfair position-aware retrieval on {b.name} ({len(b.query_ids)} queries, {len(b.corpus_ids)} documents): "
                f"one subset per {what}; binary relevance; data built in memory by posfair.mteb.tasks."
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
        out.append(cls(b, kind, subsets, labels))
    return out


# -- the encoder ------------------------------------------------------------------------------


def _document_calibration(model: Any, calibration: Any) -> Calibration | None:
    if isinstance(calibration, str) and calibration == "model":
        cal = getattr(model, "calibration", None)
        return cal if isinstance(cal, Calibration) else None
    if calibration is None or calibration is False:
        return None
    if not isinstance(calibration, Calibration):
        raise PosfairInputError(
            f"calibration must be a posfair.Calibration, None (stock) or 'model'; got {type(calibration).__name__} {calibration!r}"
        )
    if not callable(getattr(model, "using", None)):
        raise PosfairInputError(
            f"{type(model).__name__} cannot calibrate: load the model with posfair.load_model() to encode with {calibration.label()}"
        )
    with model.using(calibration):  # refuses a calibration this model cannot take (e.g. layers out of range)
        pass
    return calibration


class PositionalEncoder(SentenceTransformerEncoderWrapper):
    """MTEB's SentenceTransformer wrapper with posfair's retrieval protocol (see :func:`encoder`)."""

    def __init__(
        self,
        model: SentenceTransformer,
        calibration: Any = "model",
        *,
        store: EmbeddingStore | str | Path | None = None,
        chunk_size: int = 256,
    ):
        if not isinstance(model, SentenceTransformer):
            raise PosfairInputError(f"model must be a sentence-transformers model (posfair.load_model()); got {type(model).__name__}")
        if chunk_size < 1:
            raise PosfairInputError(f"chunk_size must be at least 1; got {chunk_size}")
        self.calibration = _document_calibration(model, calibration)
        super().__init__(model)
        self.store = EmbeddingStore(store) if isinstance(store, (str, Path)) else store
        self.chunk_size = chunk_size
        self._memo: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._documents = 0  # distinct documents encoded with the calibration, and how many of them it changed
        self._calibrated = 0
        # MTEB stores results per model name, revision and experiment_kwargs: name what this wrapper encodes
        cal = self.calibration
        experiment = {
            **(self.mteb_model_meta.experiment_kwargs or {}),
            "posfair_documents": cal.label() if cal is not None else "stock",
            "posfair_queries": "stock",
            "posfair_max_seq_length": int(model.max_seq_length),
        }
        if cal is not None:
            experiment["posfair_calibration"] = cal.key()
        self.mteb_model_meta = self.mteb_model_meta.model_copy(update={"experiment_kwargs": experiment})

    @property
    def calibrated_share(self) -> float | None:
        """Fraction of the distinct documents encoded so far that the calibration changed (None: stock)."""
        if self.calibration is None or self._documents == 0:
            return None
        return self._calibrated / self._documents

    def _prompt(self, task_metadata: Any, prompt_type: PromptType | None) -> str | None:
        """The prompt MTEB's own SentenceTransformer wrapper would use (task-specific first, then by type),
        with sentence-transformers' fallbacks of ``encode_query`` / ``encode_document``."""
        prompt = get_prompt(self.model_prompts, task_metadata, prompt_type)
        if prompt is None and prompt_type is not None:
            names = ("query",) if prompt_type == PromptType.query else ("document", "passage", "corpus")
            prompts = getattr(self.model, "prompts", None) or {}
            prompt = next((prompts[n] for n in names if n in prompts), None)
        return prompt or None

    def _embed(self, texts: list[str], calibration: Calibration | None, prompt: str | None, batch_size: int, where: str) -> np.ndarray:
        compute = posfair_encoder(self.model, calibration, prompt=prompt, batch_size=batch_size)
        computed: list[str] = []

        def run(batch: list[str]) -> np.ndarray:
            computed.extend(batch)
            with quiet_fallback():  # reported once per call below, with the counts
                return compute(batch)

        if self.store is not None:  # the namespaces posfair's evaluator uses: the two share their embeddings
            ns = embedding_namespace(self.store, model_fingerprint(self.model), calibration, prompt)
            vectors = embed_through(texts, ns, run, chunk_size=self.chunk_size)
        else:
            memo = self._memo.setdefault((calibration.key() if calibration is not None else "stock", prompt or ""), {})
            missing = list(dict.fromkeys(t for t in texts if t not in memo))
            if missing:
                memo.update(zip(missing, embed_through(missing, None, run, chunk_size=self.chunk_size), strict=True))
            vectors = (
                np.stack([memo[t] for t in texts]) if texts else np.zeros((0, compat.embedding_dimension(self.model) or 0), np.float32)
            )
        if calibration is not None and computed:
            cov = self.model.calibration_coverage(computed, calibration, prompt=prompt)
            self._documents += cov.total
            self._calibrated += cov.calibrated
            msg = cov.message()
            if msg:
                warnings.warn(f"MTEB task {where}, documents: {msg}", CalibrationFallbackWarning, stacklevel=3)
        return vectors

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """L2-normalised embeddings of MTEB's texts: documents (``prompt_type`` document) with the
        calibration, everything else with the stock model; each distinct text is encoded once per
        wrapper (or once per ``store``)."""
        unknown = sorted(set(kwargs) - {"batch_size", "show_progress_bar"})
        if unknown:
            raise PosfairInputError(
                f"posfair's MTEB encoder takes batch_size and show_progress_bar from encode_kwargs; got {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
            )
        texts: list[str] = []
        for batch in inputs:
            if "text" not in batch:
                raise PosfairInputError(f"posfair encodes texts only; MTEB task {task_metadata.name} gives {sorted(batch)}")
            texts.extend(batch["text"])
        calibration = self.calibration if prompt_type == PromptType.document else None
        prompt = self._prompt(task_metadata, prompt_type)
        vectors = self._embed(texts, calibration, prompt, int(kwargs.get("batch_size") or 32), task_metadata.name)
        return l2_normalize(np.asarray(vectors, dtype=np.float32))

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity (inner product of L2-normalised vectors), posfair's search score, whatever
        similarity function the model declares."""
        a = torch.nn.functional.normalize(torch.atleast_2d(torch.as_tensor(np.asarray(embeddings1), dtype=torch.float32)), dim=-1)
        b = torch.nn.functional.normalize(torch.atleast_2d(torch.as_tensor(np.asarray(embeddings2), dtype=torch.float32)), dim=-1)
        return a @ b.T


def encoder(
    model: SentenceTransformer, calibration: Calibration | None | str = "model", *, store: EmbeddingStore | str | Path | None = None
) -> PositionalEncoder:
    """Wrap ``model`` for ``mteb.evaluate`` with posfair's retrieval protocol.

    Documents (MTEB's ``prompt_type`` document) are encoded with ``calibration``, queries
    and every other text with the stock model, each with the prompt MTEB's own
    SentenceTransformer wrapper picks from ``model.prompts`` (a task-specific prompt
    first, then ``"query"`` / ``"document"``, then sentence-transformers' ``"passage"`` /
    ``"corpus"``).  Embeddings are L2-normalised and scored by inner product, so the
    ranking is posfair's exact cosine search.  With the same prompts (e.g.
    ``PositionalRetrievalEvaluator(bench, cal, query_prompt_name="query")`` for a model
    with a ``"query"`` prompt) MTEB's nDCG@10 per group equals posfair's.

    Passing a calibrated :class:`~posfair.FairModel` to ``mteb.evaluate`` directly gives
    the same numbers on posfair's tasks (they use this wrapper for it), but MTEB's result
    cache then cannot tell it from the stock model (see the module docs); this wrapper
    records the setting in ``mteb_model_meta.experiment_kwargs``.

    Args:
        model: a :class:`~posfair.FairModel` (any SentenceTransformer for stock runs).
        calibration: ``"model"`` (default): the model's default calibration (stock if it
            has none); None: stock; or a :class:`~posfair.Calibration`.
        store: an :class:`~posfair.store.EmbeddingStore` (or folder) to cache embeddings
            in, shared with posfair's evaluator; without one each distinct text is encoded
            once per wrapper (MTEB asks for the corpus once per subset).

    Calibrated encodings warn once per MTEB call with the documents encoded stock
    (shorter than one basket); ``calibrated_share`` gives the fraction changed so far.
    """
    return PositionalEncoder(model, calibration, store=store)


# -- scores -----------------------------------------------------------------------------------


@dataclass
class PositionScores:
    """posfair's positional metrics of one task, computed from MTEB's per-subset scores.

    ``groups``: nDCG@10 per group (NaN for a group without queries or without a result);
    ``queries``: queries per group; ``harm`` / ``psi``: :func:`posfair.retrieval.metrics.harmonic_mean`
    and :func:`~posfair.retrieval.metrics.psi` of the groups.  For ``grouping="relpos"``,
    ``buckets`` maps each PosIR length bucket to ``{"n", "ndcg@10", "bins", "psi"}`` as
    :func:`~posfair.retrieval.metrics.posir_bucket_scores` does.
    """

    task: str
    grouping: str
    groups: dict[str, float] = field(default_factory=dict)
    queries: dict[str, int] = field(default_factory=dict)
    harm: float = math.nan
    psi: float = math.nan
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics under the names :class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` uses."""
        out: dict[str, float] = {}
        for g, v in self.groups.items():
            out[f"ndcg@10[{g}]"] = v
        if self.groups:
            out["harm"] = self.harm
            out["psi"] = self.psi
        for b, v in self.buckets.items():
            out[f"psi[{b}]"] = v["psi"]
            out[f"ndcg@10[{b}]"] = v["ndcg@10"]
        return out


def _task_results(results: Any) -> tuple[list[TaskResult], dict[str, str]]:
    """The TaskResults in ``results`` and the error message of every task that failed."""
    errors: dict[str, str] = {}
    if isinstance(results, TaskResult):
        return [results], errors
    if isinstance(results, ModelResult):
        errors = {e.task_name: e.exception for e in results.exceptions or []}
        return list(results.task_results), errors
    if isinstance(results, Iterable) and not isinstance(results, (str, bytes, dict)):
        out: list[TaskResult] = []
        for r in results:
            found, errs = _task_results(r)
            out += found
            errors.update(errs)
        return out, errors
    raise PosfairInputError(
        f"results must be what mteb.evaluate returns (a ModelResult), a TaskResult or a list of them; got {type(results).__name__}"
    )


def _warn_missing(task: str, missing: list[str], present: int, declared: int, error: str | None) -> None:
    which = f": {', '.join(missing)}" if missing else " (pass tasks= to name them)"
    why = f"; MTEB reported: {error}" if error else ""
    warnings.warn(
        f"MTEB's results for task {task} have {present} of its {declared} subsets; missing{which} (scored NaN; "
        f"Harm and PSI are over the others){why}",
        MissingGroupWarning,
        stacklevel=3,
    )


def _scores_of(name: str, entries: list[dict[str, Any]], task: PositionalRetrievalTask | None, error: str | None) -> PositionScores:
    by_subset = {e["hf_subset"]: e for e in entries}
    declared = int(entries[0][_SUBSETS])
    missing = [s for s in task.subsets if s not in by_subset] if task is not None else []
    if missing or len(by_subset) < declared:
        _warn_missing(name, missing, len(by_subset), declared, error)
    if task is not None:
        short = [
            f"{s} ({int(e[_QUERIES])} of {len(task.subsets[s].queries)})"
            for s, e in by_subset.items()
            if s in task.subsets and int(e[_QUERIES]) != len(task.subsets[s].queries)
        ]
        if short:
            warnings.warn(
                f"MTEB scored fewer queries than task {name} holds in: {', '.join(short)}; those groups' scores are over the scored ones",
                MissingGroupWarning,
                stacklevel=2,
            )
    relpos = task.grouping == "relpos" if task is not None else any(_BIN in e for e in entries)
    if not relpos:
        order = list(task.group_labels) if task is not None else list(by_subset)
        groups = {g: float(by_subset[g][MAIN_SCORE]) if g in by_subset else math.nan for g in order}
        queries = {g: int(by_subset[g][_QUERIES]) if g in by_subset else 0 for g in order}
        return PositionScores(name, "groups", groups, queries, harmonic_mean(groups), psi(groups))
    buckets: dict[str, dict[str, Any]] = {}
    for k, (label, _, _) in enumerate(POSIR_BUCKETS, start=1):
        mine = [e for e in entries if int(e.get(_BUCKET, 0)) == k]
        if not mine:
            continue
        n = np.array([e[_QUERIES] for e in mine], dtype=np.float64)
        ndcg = np.array([e[MAIN_SCORE] for e in mine], dtype=np.float64)
        bins = {int(e[_BIN]): float(e[MAIN_SCORE]) for e in sorted(mine, key=lambda e: e[_BIN]) if int(e[_BIN]) >= 0}
        buckets[label] = {"n": int(n.sum()), "ndcg@10": float((n * ndcg).sum() / n.sum()), "bins": bins, "psi": psi(bins)}
    return PositionScores(name, "relpos", buckets=buckets)


def position_scores(results: Any, tasks: Sequence[PositionalRetrievalTask] | None = None) -> dict[str, PositionScores]:
    """posfair's positional metrics from what ``mteb.evaluate`` returns, per posfair task.

    Args:
        results: a ``mteb`` ModelResult (what ``mteb.evaluate`` returns), a TaskResult, or a
            list of them; results of other MTEB tasks are ignored.
        tasks: the tasks :func:`tasks` returned.  With them, only those tasks are read, a task
            or group missing from the results is named in a :class:`MissingGroupWarning`, and
            groups keep the benchmark's order (groups without queries included, as NaN).
            Without them, the groups are the subsets found, and a shortfall is still warned.

    Returns:
        task name -> :class:`PositionScores`: nDCG@10 per group (MTEB's ``ndcg_at_10`` of
        the group's subset, i.e. the mean over its queries, as posfair's group score), Harm
        and PSI computed with :mod:`posfair.retrieval.metrics`; per-bucket scores for
        relative-position tasks.

    Raises:
        PosfairInputError: ``results`` is not MTEB results, holds no posfair task, or
            ``tasks`` holds something other than posfair tasks.
    """
    found, errors = _task_results(results)
    wanted: dict[str, PositionalRetrievalTask] = {}
    for t in tasks or ():
        if not isinstance(t, PositionalRetrievalTask):
            raise PosfairInputError(f"tasks must be what posfair.mteb.tasks() returned; got {type(t).__name__}")
        wanted[t.metadata.name] = t
    out: dict[str, PositionScores] = {}
    for tr in found:
        if wanted and tr.task_name not in wanted:
            continue
        entries = [e for e in tr.scores.get(SPLIT, []) if _QUERIES in e]
        if entries:
            out[tr.task_name] = _scores_of(tr.task_name, entries, wanted.get(tr.task_name), errors.get(tr.task_name))
    for name in wanted:
        if name not in out:
            why = f" (MTEB reported: {errors[name]})" if name in errors else ""
            warnings.warn(f"MTEB's results lack task {name}{why}", MissingGroupWarning, stacklevel=2)
    if not out:
        names = sorted({tr.task_name for tr in found} | set(errors))
        raise PosfairInputError(f"no result of a posfair task among MTEB's results (tasks: {names or 'none'})")
    return out
