"""Position-aware retrieval evaluation of one model under one encoding setting.

Protocol of the papers: documents are encoded with the setting under test
(stock, a :class:`~posfair.Calibration`, or Segment Embed Average), queries are
always encoded with the stock model (with the model's query prompt, e.g.
Qwen3-Embedding's ``"Instruct: ...\\nQuery: "``); exact inner-product search of
L2-normalised embeddings (top 100); nDCG@10 per query (graded: the qrels score is the
gain); group scores, Harm, PSI; per length bucket PSI over relative-position bins for
PosIR-style benchmarks.  Every embedding goes through an :class:`~posfair.store.EmbeddingStore`
when one is given, keyed by model fingerprint, setting and prompt.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posfair.calibration import MODEL_DEFAULT, STOCK, Calibration
from posfair.calibration.choice import Stock
from posfair.calibration.coverage import NOOP_LABEL, CalibrationFallbackWarning, quiet_fallback
from posfair.encoding import embed_through, encoder, l2_normalize, model_pooling
from posfair.encoding.evaluator_base import PosfairEvaluator, metric_name_part, run_tag
from posfair.files.atomic import atomic_write_json, atomic_write_parquet
from posfair.model import model_fingerprint
from posfair.model.info import display_name
from posfair.retrieval.benchmarks import RetrievalBenchmark
from posfair.retrieval.groups import relpos_bin
from posfair.retrieval.late import LateChunking, late_scores
from posfair.retrieval.metrics import group_scores, harmonic_mean, ndcg_at_k, posir_bucket_scores, psi, recall_at_k
from posfair.retrieval.sea import SegmentEmbedAverage
from posfair.retrieval.search import search
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import ProgressCallback, progress_tasks
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import EmbeddingStore, Namespace, embedding_namespace, text_key

__all__ = [
    "QWEN3_QUERY_PROMPT",
    "PositionalRetrievalEvaluator",
    "RetrievalResult",
    "DocumentStrategy",
    "default_query_prompt",
]

QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
# (substring of the model name, lower case) -> query prefix used by the published evaluations
_QUERY_PROMPTS = {"qwen3-embedding": QWEN3_QUERY_PROMPT}

logger = logging.getLogger(__name__)


#: where a query is searched: among its own domain's documents, or the whole loaded corpus
SEARCH_SCOPES = ("domain", "corpus")

#: how the documents are embedded (the setting under test; queries are always stock): the stock model,
#: a calibration, Segment Embed Average, or late chunking
DocumentStrategy = Calibration | Stock | SegmentEmbedAverage | LateChunking
#: the ``RetrievalResult.method`` of each kind of strategy
METHODS = ("stock", "calibrated", "sea", "late")


def check_strategy(documents: Any) -> DocumentStrategy:
    """``documents`` if it is a :data:`DocumentStrategy`; PosfairInputError naming the accepted values otherwise."""
    if isinstance(documents, (Calibration, SegmentEmbedAverage, LateChunking)) or documents is STOCK:
        return documents
    hint = " (say posfair.STOCK for the stock model)" if documents is None or documents is False else ""
    if documents is MODEL_DEFAULT:
        hint = " (an evaluator names its setting before it sees a model: pass model.calibration to evaluate the model as it encodes)"
    raise PosfairInputError(
        "documents must be posfair.STOCK, a posfair.Calibration, a SegmentEmbedAverage or a LateChunking; "
        f"got {type(documents).__name__} {documents!r}{hint}"
    )


def strategy_method(documents: DocumentStrategy) -> str:
    """The method name of a strategy: one of :data:`METHODS`."""
    if isinstance(documents, LateChunking):
        return "late"
    if isinstance(documents, SegmentEmbedAverage):
        return "sea"
    return "stock" if documents is STOCK else "calibrated"


def _model_name(model: Any) -> str:
    for attr in ("name_or_path", "model_name_or_path"):
        v = getattr(model, attr, None)
        if isinstance(v, str) and v:
            return v
    card = getattr(model, "model_card_data", None)
    if card is not None and getattr(card, "base_model", None):
        return str(card.base_model)
    try:
        return str(model[0].auto_model.config._name_or_path)
    except (AttributeError, IndexError, KeyError, TypeError):
        return type(model).__name__


def default_query_prompt(model: Any) -> str | None:
    """The query prefix for this model: its own ``query`` prompt when its folder configures one (e.g.
    "query: " for multilingual-e5-small), else the one the published evaluations used (None for most models)."""
    own = (getattr(model, "prompts", None) or {}).get("query")
    if own:
        return own
    name = _model_name(model).lower()
    for pattern, prompt in _QUERY_PROMPTS.items():
        if pattern in name:
            return prompt
    return None


@dataclass
class RetrievalResult:
    """Per-query and aggregate results of one setting on one benchmark."""

    benchmark: str
    setting: str
    method: str  # "stock", "calibrated", "sea" or "late"
    calibration: dict[str, Any] | None
    query_ids: list[str]
    ndcg: np.ndarray
    recall: np.ndarray
    metrics: dict[str, float]
    groups: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: fraction of the corpus documents the calibration actually changed (None: stock / SEA / late chunking / unknown)
    calibrated_share: float | None = None
    #: late chunking: its settings (aggregate, chunks) and chunk counts (None for the other methods)
    late: dict[str, Any] | None = None
    #: where each query was searched: "domain" (its own domain's documents) or "corpus" (every document)
    search_scope: str = "domain"
    #: the model's one name (posfair.model.info.display_name) and the token limit it encoded with ("" / 0: not recorded)
    model: str = ""
    token_limit: int = 0
    #: per positional group, the indices of its queries (for paired intervals by group; empty: not recorded)
    group_queries: dict[str, list[int]] = field(default_factory=dict)

    @property
    def noop(self) -> bool:
        """A calibration that changed no document: its figures are the stock model's, not a result."""
        return self.method == "calibrated" and self.calibrated_share == 0

    @property
    def evaluated(self) -> bool:
        """False for a no-op grid point a sweep skipped (no metrics)."""
        return bool(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "setting": self.setting,
            "method": self.method,
            "calibration": self.calibration,
            "query_ids": list(self.query_ids),
            "ndcg": [float(x) for x in self.ndcg],
            "recall": [float(x) for x in self.recall],
            "metrics": self.metrics,
            "groups": self.groups,
            "buckets": {b: {**v, "bins": {str(k): x for k, x in v["bins"].items()}} for b, v in self.buckets.items()},
            "calibrated_share": self.calibrated_share,
            "late": self.late,
            "search_scope": self.search_scope,
            "model": self.model,
            "token_limit": self.token_limit,
            "group_queries": self.group_queries,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RetrievalResult:
        return cls(
            benchmark=d["benchmark"],
            setting=d["setting"],
            method=d["method"],
            calibration=d["calibration"],
            query_ids=list(d["query_ids"]),
            ndcg=np.asarray(d["ndcg"], dtype=np.float64),
            recall=np.asarray(d["recall"], dtype=np.float64),
            metrics=dict(d["metrics"]),
            groups=dict(d["groups"]),
            buckets={b: {**v, "bins": {int(k): x for k, x in v["bins"].items()}} for b, v in d["buckets"].items()},
            calibrated_share=None if d.get("calibrated_share") is None else float(d["calibrated_share"]),
            late=d.get("late"),
            search_scope=d.get("search_scope", "domain"),
            model=d.get("model", ""),
            token_limit=int(d.get("token_limit", 0)),
            group_queries={g: [int(i) for i in v] for g, v in d.get("group_queries", {}).items()},
        )

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> RetrievalResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


def score_rankings(
    benchmark: RetrievalBenchmark, ranked: np.ndarray, k: int = 10, recall_depth: int = 100
) -> tuple[np.ndarray, np.ndarray, dict[str, float], dict[str, float], dict]:
    """Per-query nDCG@k and recall, the flat metrics dict, group scores and PosIR bucket stats."""
    ndcg = ndcg_at_k(ranked, benchmark.relevant, k, gains=benchmark.gains)
    recall = recall_at_k(ranked, benchmark.relevant, recall_depth)
    metrics: dict[str, float] = {f"ndcg@{k}": float(ndcg.mean()), f"recall@{recall_depth}": float(recall.mean())}
    groups = group_scores(ndcg, benchmark.groups) if benchmark.groups else {}
    for g, v in groups.items():
        metrics[f"ndcg@{k}[{g}]"] = v
    if groups:
        metrics["harm"] = harmonic_mean(groups)
        metrics["psi"] = psi(groups)
    buckets: dict = {}
    if benchmark.is_posir:
        buckets = posir_bucket_scores(ndcg, benchmark.length_bucket, relpos_bin(benchmark.relpos))
        for b, v in buckets.items():
            metrics[f"psi[{b}]"] = v["psi"]
            metrics[f"ndcg@{k}[{b}]"] = v["ndcg@10"]
    return ndcg, recall, metrics, groups, buckets


class PositionalRetrievalEvaluator(PosfairEvaluator):
    """A sentence-transformers evaluator: ``evaluator(model) -> dict[str, float]``.

    The keys are prefixed with ``name``; the primary metric is Harm (``ndcg@10`` for a
    benchmark without position groups), ``evaluator.primary_metric``, higher is better.

    Args:
        benchmark: a :class:`RetrievalBenchmark`.
        documents: how the documents are embedded (queries are always stock), one
            :data:`DocumentStrategy`: ``posfair.STOCK`` (default) = the stock model, whatever
            calibration the model carries; a :class:`~posfair.Calibration` (pass ``model.calibration``
            to evaluate the model as it encodes); a :class:`SegmentEmbedAverage`; or a
            :class:`~posfair.retrieval.late.LateChunking` (documents scored by the max or mean over
            their late-chunked chunk vectors).
        query_prompt: prefix for queries; ``"auto"`` (default) = the published
            one for the model (Qwen3-Embedding's instruction, none for others);
            None or "" = no prefix.
        query_prompt_name: a name in ``model.prompts`` to use instead.
        document_prompt: prefix for documents (none in the papers).
        store: an :class:`EmbeddingStore` (or a directory) caching every embedding.
        top_k: search depth (>= 10; recall is reported at this depth).
        show_progress_bar: tqdm bars of the query and document encoding; None (default)
            shows them when this module's logger is at INFO or DEBUG (as sentence-transformers does).
        progress: instead of tqdm, ``progress(description, total, already_done) -> advance(n)``
            (see :mod:`posfair.runtime.progress`), e.g. a command line's own bar.
        search_scope: ``"domain"`` (default): each query is searched among its own domain's documents
            (PosIR's languages / domains, a built benchmark's languages; SQuAD-PosQ and FineWeb-PosQ have one
            domain), each subset its own corpus as in the benchmarks' per-subset results; ``"corpus"``: every
            query against every document of the loaded benchmark.  Recorded in every result.
        name: the prefix of every metric; None (default) = the benchmark and the setting, e.g.
            ``"aligned_eng-Latn_B128-L0.5-a0.5"``, so that evaluators of several settings or
            benchmarks in one ``SequentialEvaluator`` never overwrite each other's keys;
            ``""`` = bare metric names.
    """

    def __init__(
        self,
        benchmark: RetrievalBenchmark,
        documents: DocumentStrategy = STOCK,
        *,
        query_prompt: str | None = "auto",
        query_prompt_name: str | None = None,
        document_prompt: str | None = None,
        store: EmbeddingStore | str | Path | None = None,
        batch_size: int = 32,
        top_k: int = 100,
        use_faiss: bool = False,
        name: str | None = None,
        show_progress_bar: bool | None = None,
        encode_chunk: int = 256,
        report_fallback: bool = True,
        progress: ProgressCallback | None = None,
        search_scope: str = "domain",
    ):
        super().__init__()
        if not isinstance(benchmark, RetrievalBenchmark):
            raise PosfairInputError(
                f"benchmark must be a RetrievalBenchmark (posfair.retrieval.benchmarks); got {type(benchmark).__name__}"
            )
        self.documents = check_strategy(documents)
        if self.late is not None and document_prompt:
            raise PosfairInputError(
                "late chunking takes no document prompt (chunk spans are on the passage text itself)"
            )
        if top_k < 10:
            raise PosfairInputError(f"top_k must be >= 10 for nDCG@10; got {top_k}")
        if search_scope not in SEARCH_SCOPES:
            raise PosfairInputError(f"search_scope must be one of {', '.join(SEARCH_SCOPES)}; got {search_scope!r}")
        self.search_scope = search_scope
        self.benchmark = benchmark
        self.query_prompt = query_prompt
        self.query_prompt_name = query_prompt_name
        self.document_prompt = document_prompt or None
        self.store = EmbeddingStore(store) if isinstance(store, (str, Path)) else store
        self.batch_size = batch_size
        self.top_k = top_k
        self.use_faiss = use_faiss
        self.name = (
            self._check_name(name)
            if name is not None
            else f"{metric_name_part(benchmark.name)}_{metric_name_part(self.setting)}"
        )
        self.show_progress_bar = show_progress_bar
        self.progress = progress
        self.encode_chunk = encode_chunk
        self.report_fallback = report_fallback
        self.base_metric = "harm" if benchmark.groups else "ndcg@10"
        self.greater_is_better = True

    # -- settings ---------------------------------------------------------------------------
    @property
    def method(self) -> str:
        """``"stock"``, ``"calibrated"``, ``"sea"`` or ``"late"`` (:func:`strategy_method`)."""
        return strategy_method(self.documents)

    @property
    def calibration(self) -> Calibration | Stock:
        """What the documents' own encodings run with: the calibration, or STOCK (stock, SEA, late chunking)."""
        return self.documents if isinstance(self.documents, Calibration) else STOCK

    @property
    def sea(self) -> SegmentEmbedAverage | None:
        return self.documents if isinstance(self.documents, SegmentEmbedAverage) else None

    @property
    def late(self) -> LateChunking | None:
        return self.documents if isinstance(self.documents, LateChunking) else None

    @property
    def setting(self) -> str:
        if self.late is not None:
            return self.late.setting
        if self.sea is not None:
            return "SEA"
        return self.calibration.label()

    def _query_prompt(self, model: Any) -> str | None:
        if self.query_prompt_name is not None:
            prompts = getattr(model, "prompts", None) or {}
            if self.query_prompt_name not in prompts:
                raise ValueError(f"the model has no prompt named {self.query_prompt_name!r}; it has {sorted(prompts)}")
            return prompts[self.query_prompt_name] or None
        if self.query_prompt == "auto":
            return default_query_prompt(model)
        return self.query_prompt or None

    def _encoder(
        self, model: Any, prompt: str | None, calibration: Calibration | Stock
    ) -> Callable[[list[str]], np.ndarray]:
        # stored as the model returns them (the shared cache format); normalised in evaluate()
        return encoder(model, calibration, prompt=prompt, batch_size=self.batch_size)

    def _namespace(self, fp: str, **meta: Any) -> Namespace | None:
        return self.store.namespace(model=fp, **meta) if self.store is not None else None

    def _embed(
        self,
        texts: list[str],
        ns: Namespace | None,
        compute: Callable[[list[str]], np.ndarray],
        advance: Callable[[int], None],
        chunk: int | None = None,
    ) -> np.ndarray:
        return embed_through(texts, ns, compute, chunk_size=chunk or self.encode_chunk, progress=advance)

    def calibrated_share(self, model: Any) -> float | None:
        """Fraction of the corpus documents the calibration changes (None for stock and SEA).

        Counted from the documents' token spans as the model encodes them (document prompt,
        truncation to ``max_seq_length``), with the engine's rule; nothing is embedded.
        """
        if self.method != "calibrated":
            return None
        texts = self.benchmark.corpus_texts
        return float(model.calibrated_share(texts, self.calibration, prompt=self.document_prompt)) if texts else None

    # -- encoding ---------------------------------------------------------------------------
    def encode_queries(self, model: Any, advance: Callable[[int], None] = lambda n: None) -> np.ndarray:
        prompt = self._query_prompt(model)
        ns = (
            embedding_namespace(self.store, model_fingerprint(model), STOCK, prompt) if self.store is not None else None
        )
        return self._embed(self.benchmark.query_texts, ns, self._encoder(model, prompt, STOCK), advance)

    def encode_documents(self, model: Any, advance: Callable[[int], None] = lambda n: None) -> np.ndarray:
        fp = model_fingerprint(model)
        texts = self.benchmark.corpus_texts
        if self.sea is not None:
            chunk_ns = self._namespace(fp, kind="sea-chunk", calibration="none", normalize=self.sea.normalize_chunks)
            ns = self._namespace(fp, kind="sea-document", sea=self.sea.config())
            # SEA chunks each passage separately (slow): store every few passages
            return self._embed(
                texts,
                ns,
                lambda batch: self.sea.embed(model, batch, chunk_ns),
                advance,
                chunk=min(self.encode_chunk, 16),
            )
        ns = (
            embedding_namespace(self.store, fp, self.calibration, self.document_prompt)
            if self.store is not None
            else None
        )
        with (
            quiet_fallback()
        ):  # the share is reported once per setting (RetrievalResult.calibrated_share), not per chunk
            return self._embed(texts, ns, self._encoder(model, self.document_prompt, self.calibration), advance)

    def documents_to_encode(self, model: Any) -> int:
        """How many distinct documents :meth:`encode_documents` would encode (not in the store)."""
        texts = self.benchmark.corpus_texts
        if self.store is None:
            return len(set(texts))
        ns = embedding_namespace(self.store, model_fingerprint(model), self.calibration, self.document_prompt)
        return len(ns.missing(text_key(t) for t in texts))

    def stock_pass(self, model: Any) -> None:
        """Encode the documents stock as :meth:`encode_documents` would when none is stored (the same chunks and
        batches), storing nothing: inside ``sharing_stock_layers`` this keeps the stock layers for the calibrated
        passes that follow when the stock vectors themselves come from the store."""
        b = self.benchmark
        with progress_tasks(self.show_progress_bar, logger, self.progress) as task:
            advance = task(f"{b.name}: documents (stock layers for the calibrations)", len(set(b.corpus_texts)))
            self._embed(b.corpus_texts, None, self._encoder(model, self.document_prompt, STOCK), advance)

    def encode_chunks(
        self, model: Any, advance: Callable[[int], None] = lambda n: None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Late chunking: (chunk vectors, owner document index of each), through the store."""
        ns = (
            self._namespace(model_fingerprint(model), kind="late-chunk", late=self.late.config())
            if self.store is not None
            else None
        )
        return self.late.embed(model, self.benchmark.corpus_texts, ns, advance, chunk=min(self.encode_chunk, 16))

    # -- evaluation -------------------------------------------------------------------------
    def retrieve_late(self, q: np.ndarray, chunks: np.ndarray, owner: np.ndarray, block: int = 256) -> np.ndarray:
        """Top-k global document indices per query, documents scored by the late-chunking aggregate (-1 = padding)."""
        ranked = np.full((len(q), self.top_k), -1, dtype=np.int64)
        for _, qi, di in self.search_slices():
            if len(qi) == 0:
                continue
            local = np.full(len(self.benchmark.corpus_texts), -1, dtype=np.int64)
            local[di] = np.arange(len(di))
            rows = np.flatnonzero(local[owner] >= 0)
            order = rows[np.argsort(local[owner[rows]], kind="stable")]
            k = min(self.top_k, len(di))
            for start in range(0, len(qi), block):
                qb = qi[start : start + block]
                scores = late_scores(q[qb], chunks[order], local[owner[order]], len(di), self.late.aggregate)
                top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
                ranked[qb, :k] = di[top]
        return ranked

    def search_slices(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """``(domain, query indices, document indices)`` searched together: each domain of the benchmark
        (``search_scope="domain"``), or every query against every document (``"corpus"``)."""
        if self.search_scope == "corpus":
            b = self.benchmark
            return [("", np.arange(len(b.query_ids)), np.arange(len(b.corpus_ids)))]
        return self.benchmark.domain_slices()

    def retrieve(self, q: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Top-k global document indices per query (searched as :meth:`search_slices` says; -1 = padding)."""
        ranked = np.full((len(q), self.top_k), -1, dtype=np.int64)
        for _, qi, di in self.search_slices():
            if len(qi) == 0:
                continue
            idx, _ = search(q[qi], d[di], k=self.top_k, use_faiss=self.use_faiss)
            ranked[qi, : idx.shape[1]] = di[idx]
        return ranked

    def evaluate(self, model: Any) -> RetrievalResult:
        b = self.benchmark
        share = self.calibrated_share(model)
        if self.report_fallback and share is not None and share < 1:
            what = (
                NOOP_LABEL + ", the figures are the stock model's"
                if share == 0
                else f"the other {1 - share:.1%} were encoded stock"
            )
            warnings.warn(
                f"{b.name}, {self.setting}: calibrated share {share:.3f} of {len(b.corpus_texts)} documents ({what}; "
                f"documents shorter than one basket of {self.calibration.basket_size} content tokens are encoded stock)",
                CalibrationFallbackWarning,
                stacklevel=user_stacklevel(),
            )
        with progress_tasks(self.show_progress_bar, logger, self.progress) as task:
            # the encoding layer reports distinct texts (each is encoded once)
            q = self.encode_queries(model, task(f"{b.name}: queries (stock)", len(set(b.query_texts))))
            if self.late is not None:
                chunks, owner = self.encode_chunks(
                    model, task(f"{b.name}: documents ({self.setting})", len(set(b.corpus_texts)))
                )
                dropped = self.late.dropped(model, b.corpus_texts)
            else:
                d = self.encode_documents(
                    model, task(f"{b.name}: documents ({self.setting})", len(set(b.corpus_texts)))
                )
        late_info = None
        if self.late is not None:
            ranked = self.retrieve_late(l2_normalize(q), l2_normalize(chunks), owner)
            counts = np.bincount(owner, minlength=len(b.corpus_texts))
            late_info = {
                "aggregate": self.late.aggregate,
                "chunks": self.late.config()["chunks"],
                "pooling": "mean over span",
                "model_pooling": model_pooling(model),
                "chunks_total": int(len(owner)),
                "chunks_per_document": float(counts.mean()),
                "chunks_dropped": int(dropped),
            }
            if dropped:
                warnings.warn(
                    f"{b.name}, {self.setting}: {dropped} chunks lie beyond the token limit of {model.max_seq_length} tokens "
                    "(truncated passages) or cover no token, and were dropped",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
        else:
            ranked = self.retrieve(l2_normalize(q), l2_normalize(d))
        ndcg, recall, metrics, groups, buckets = score_rankings(b, ranked, 10, self.top_k)
        return RetrievalResult(
            benchmark=b.name,
            setting=self.setting,
            method=self.method,
            calibration=self._calibration_record(),
            query_ids=list(b.query_ids),
            ndcg=ndcg,
            recall=recall,
            metrics=metrics,
            groups=groups,
            buckets=buckets,
            calibrated_share=share,
            late=late_info,
            search_scope=self.search_scope,
            model=display_name(model),
            token_limit=int(getattr(model, "max_seq_length", 0) or 0),
            group_queries={g: np.flatnonzero(m).tolist() for g, m in b.groups.items()},
        )

    def _calibration_record(self) -> dict[str, Any] | None:
        return self.calibration.to_dict() if self.method == "calibrated" else None

    def noop_result(self, share: float = 0.0) -> RetrievalResult:
        """The record of a calibration that changes no document, without evaluating it (no metrics)."""
        b = self.benchmark
        nan = np.full(len(b.query_ids), np.nan)
        return RetrievalResult(
            benchmark=b.name,
            setting=self.setting,
            method=self.method,
            calibration=self._calibration_record(),
            query_ids=list(b.query_ids),
            ndcg=nan,
            recall=nan.copy(),
            metrics={},
            calibrated_share=share,
            search_scope=self.search_scope,
        )

    def __call__(
        self, model: Any, output_path: str | None = None, epoch: float = -1, steps: int = -1
    ) -> dict[str, float]:
        result = self.evaluate(model)
        metrics = dict(result.metrics)
        if result.calibrated_share is not None:
            metrics["calibrated_share"] = result.calibrated_share
        if output_path is not None:
            out = Path(output_path)
            stem = "positional_retrieval_" + metric_name_part(self.name or f"{result.benchmark}_{self.setting}")
            suffix = run_tag(epoch, steps)
            atomic_write_json(out / f"{stem}{suffix}.json", metrics)
            atomic_write_parquet(
                out / f"{stem}{suffix}_per_query.parquet",
                pd.DataFrame(
                    {"query_id": result.query_ids, "ndcg@10": result.ndcg, f"recall@{self.top_k}": result.recall}
                ),
            )
        return self.finish(model, metrics, epoch, steps)

    def get_config_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark.name, "setting": self.setting, "top_k": self.top_k}
