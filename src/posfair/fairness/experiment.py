"""Running an audit: instances x (stock + calibrations), cached and resumable.

For each experiment instance and each variant (stock, then every calibration):

1. the standalone segments are embedded once per (model, calibration);
2. the documents are embedded (for mean-pooled models in the same forward pass
   the contextualised segments are taken from the final-layer token states);
3. sigma / tau are computed per (document, position), together with the
   fidelity measures (:func:`posfair.fairness.measures.fidelity_measures`): the
   mean cosine of the document to the standalone segments of the *other*
   segment sets of the instance (``other_cos``), the margin ``sigma - other_cos``,
   own-segment recall@n among the instance's standalone segments (``recall``) and
   the drift ``cos(calibrated document, stock document)`` (``drift``; exactly 1
   for the stock rows).

Stock standalone segments are always computed, which gives the semantic-fidelity
control (calibrated documents against *stock* standalone segments, paper Fig. 14)
for free.  Every vector is stored in the embedding cache; the observation table
is a pure function of the cached vectors, so a re-run computes nothing and a run
killed at any moment resumes to identical results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from posfair import encoding as enc
from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.fairness.documents import (
    Instance,
    LanguageConfig,
    build_instance,
    more_sets_advice,
    prepare_corpus,
    token_segment_index,
)
from posfair.fairness.measures import contextualised_segments, fidelity_measures, rowwise_cosine
from posfair.model import model_fingerprint
from posfair.model.info import display_name
from posfair.runtime.errors import PosfairInputError
from posfair.stats.inference import Inference
from posfair.store import EmbeddingStore, embedding_namespace, text_key

__all__ = ["AuditSettings", "ModelInfo", "run_instances", "build_instances", "STOCK_LABEL", "MEASURES", "FIDELITY"]

log = logging.getLogger(__name__)

#: the ``calibration`` column value of the stock model's rows (``posfair.STOCK.label()``)
STOCK_LABEL = STOCK.label()
MEASURES = ("sigma", "tau")
#: per-observation fidelity columns (``recall`` and ``drift`` are per document, repeated over its positions)
FIDELITY = ("other_cos", "margin", "recall", "drift")
OBSERVATION_COLUMNS = [
    "model",
    "calibration",
    "calibration_key",
    "setting",
    "n",
    "config",
    "config_key",
    "family",
    "lead_lang",
    "later_lang",
    "doc_id",
    "set_id",
    "perm_index",
    "permutation",
    "position",
    "segment_id",
    "topic",
    "lang",
    "seg_tokens",
    "doc_tokens",
    "sigma",
    "tau",
    *FIDELITY,
]


@dataclass(frozen=True)
class AuditSettings:
    """What to measure.

    Args:
        n_values: segments per document (each >= 2).
        configs: language configurations (``LanguageConfig`` or specs like ``"en"``, ``"de:en"``).
        target_docs: documents per instance; ``ceil(target_docs / n!)`` segment sets are drawn.
        seed: sampling seed (sets are drawn per instance from a seed derived from it).
        max_seq_length: token limit for documents; None = the model's configured
            ``max_seq_length`` (:func:`posfair.model.token_limit`, the rule every posfair
            command follows); a larger value (up to the position limit) is set on the model
            for the run, then restored, and recorded in the results' metadata.
        min_segment_tokens / max_segment_tokens: segment length window (tokens, no specials);
            None = ``default_length_window(limit, n, min_ratio=window_ratio)`` per n
            (per-segment budget ``(limit - specials) // n``; for a 512-token model
            n=3 gives 57..170 and n=4 gives 43..127 tokens).
        batch_size: encoder batch size; chunk_size: texts per cache shard.
        retention: compute tau (contextualised segments); None = only for mean-pooled models.
        control: add the semantic-fidelity control rows for every calibration.
        inference: how the OLS p-values are computed: ``"cluster"`` (CR1 cluster-robust
            standard errors, t with G-1 degrees of freedom) or ``"wild"`` (wild cluster
            bootstrap, see :mod:`posfair.stats.position_ols`).
        clusters: what is a cluster: ``"conservative"`` (the default: per coefficient the wider interval of
            two-way set+topic and component clustering, each with its own G, and which one it used; the papers' set
            clustering when no topic is in two sets), ``"set+topic"`` (two-way by segment set and topic), ``"set"``
            (the papers') or ``"component"`` (see :mod:`posfair.stats.clusters`).
        bootstrap_draws / bootstrap_weights / bootstrap_seed: the wild bootstrap's draws B,
            weights (``"webb"`` or ``"rademacher"``; Rademacher enumerates all 2^G sign
            vectors when 2^G < B) and seed (recorded for every run, used only with ``"wild"``).
        family_field: audit per document family: the corpus column naming each topic's family
            (``"source"`` in the bundled corpus: ``debian-faq`` or ``installation-guide``).  Every
            instance is then drawn once per family (``target_docs`` documents each, sets within one
            family, so the families share no topic); the observations carry ``family``, the
            coefficient tables pool the families, and :mod:`posfair.fairness.families` compares them.
    """

    n_values: tuple[int, ...] = (3, 4)
    configs: tuple[LanguageConfig, ...] = (LanguageConfig("en", "en"),)
    target_docs: int = 1000
    seed: int = 0
    max_seq_length: int | None = None
    min_segment_tokens: int | None = None
    max_segment_tokens: int | None = None
    window_ratio: float = 1 / 3
    batch_size: int = 16
    chunk_size: int = 64
    retention: bool | None = None
    control: bool = True
    inference: str = "cluster"
    clusters: str = "conservative"
    bootstrap_draws: int = 9999
    bootstrap_weights: str = "webb"
    bootstrap_seed: int = 0
    family_field: str | None = None

    def __post_init__(self) -> None:
        ns = tuple(int(n) for n in self.n_values)
        if not ns:
            raise PosfairInputError("n_values must not be empty")
        bad = [n for n in ns if n < 2]
        if bad:
            raise PosfairInputError(f"n (segments per document) must be >= 2; got {bad}")
        object.__setattr__(self, "n_values", tuple(sorted(set(ns))))
        cfgs = tuple(c if isinstance(c, LanguageConfig) else LanguageConfig.parse(str(c)) for c in self.configs)
        if not cfgs:
            raise PosfairInputError("at least one language configuration is needed")
        object.__setattr__(self, "configs", tuple(dict.fromkeys(cfgs)))
        if self.target_docs < 1:
            raise PosfairInputError(f"target_docs must be >= 1; got {self.target_docs}")
        if self.max_seq_length is not None and self.max_seq_length < 4:
            raise PosfairInputError(f"max_seq_length must be >= 4; got {self.max_seq_length}")
        if self.batch_size < 1 or self.chunk_size < 1:
            raise PosfairInputError("batch_size and chunk_size must be >= 1")
        spec = self.inference_spec  # validates; stores the normalised spellings
        object.__setattr__(self, "inference", spec.method)
        object.__setattr__(self, "bootstrap_weights", spec.weights)
        object.__setattr__(self, "clusters", spec.clusters)

    @property
    def inference_spec(self) -> Inference:
        """The :class:`~posfair.stats.inference.Inference` of these settings."""
        return Inference(
            method=self.inference,
            draws=self.bootstrap_draws,
            weights=self.bootstrap_weights,
            seed=self.bootstrap_seed,
            clusters=self.clusters,
        )

    def with_inference(self, spec: Inference) -> AuditSettings:
        """These settings with the inference ``spec`` (the inverse of :attr:`inference_spec`)."""
        return replace(
            self,
            inference=spec.method,
            clusters=spec.clusters,
            bootstrap_draws=spec.draws,
            bootstrap_weights=spec.weights,
            bootstrap_seed=spec.seed,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["configs"] = [c.name for c in self.configs]
        d["n_values"] = list(self.n_values)
        return d


@dataclass
class ModelInfo:
    name: str
    fingerprint: str
    pooling: str
    limit: int
    retention: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_instances(corpus: pd.DataFrame, settings: AuditSettings, tokenizer, limit: int) -> list[Instance]:
    """All instances of the settings (seeded; independent of the model except for its tokenizer); with
    ``settings.family_field`` one instance per (n, configuration, family)."""
    df = prepare_corpus(corpus, settings.family_field)
    families = sorted(df["family"].unique()) if settings.family_field else [""]
    langs = sorted(df["lang"].unique())
    for cfg in settings.configs:
        for lang in cfg.needed:
            if lang not in langs:
                raise PosfairInputError(
                    f"unknown language {lang!r} in configuration {cfg.name}: the corpus has {langs}"
                )
    lengths: dict[tuple[str, str], int] = {}
    out = []
    for n in settings.n_values:
        for cfg in settings.configs:
            for family in families:
                inst = build_instance(
                    df,
                    n,
                    cfg,
                    tokenizer=tokenizer,
                    limit=limit,
                    target_docs=settings.target_docs,
                    seed=settings.seed,
                    min_segment_tokens=settings.min_segment_tokens,
                    max_segment_tokens=settings.max_segment_tokens,
                    window_ratio=settings.window_ratio,
                    token_lengths=lengths,
                    family=family,
                )
                out.append(inst)
                if len(inst.sets) < 2:
                    where = f", family {family}" if family else ""
                    raise PosfairInputError(
                        f"instance (n={n}, {cfg.name}{where}) has {len(inst.sets)} segment set(s); clustered standard "
                        f"errors need at least 2: {more_sets_advice(inst.report, 2)}"
                    )
    return out


class _Encoder:
    """Encodes one variant of one instance through the cache."""

    def __init__(self, model, store: EmbeddingStore, info: ModelInfo, settings: AuditSettings, progress=None):
        self.model = model
        self.store = store
        self.info = info
        self.settings = settings
        self.progress = progress
        self.tokenizer = enc.model_tokenizer(model)

    def _ns(self, calibration: Resolved, kind: str):
        if kind == "embedding":  # pooled embeddings: the namespace shared with every other command
            return embedding_namespace(self.store, self.info.fingerprint, calibration)
        return self.store.namespace(model=self.info.fingerprint, calibration=calibration.key(), kind=kind)

    def cached(self, texts: Sequence[str], calibration: Resolved) -> tuple[int, int]:
        """(distinct texts, how many of them are in the pooled-embedding cache) for ``calibration``."""
        keys = {text_key(t) for t in texts}
        return len(keys), len(keys) - len(self._ns(calibration, "embedding").missing(keys))

    def segments(self, texts: Sequence[str], calibration: Resolved, tick=None) -> np.ndarray:
        s = self.settings
        return enc.embed_through(
            texts,
            self._ns(calibration, "embedding"),
            enc.encoder(self.model, calibration, batch_size=s.batch_size),
            chunk_size=s.chunk_size,
            progress=tick,
        )

    def documents(self, inst: Instance, calibration: Resolved, tick=None):
        s = self.settings
        retention = self.info.retention

        def compute(texts, spans):
            pooled, tokens = enc.encode_documents(
                self.model, texts, calibration, batch_size=s.batch_size, with_tokens=retention
            )
            if not retention:
                return pooled, None
            tok = self.tokenizer(
                list(texts),
                add_special_tokens=True,
                return_offsets_mapping=True,
                return_special_tokens_mask=True,
                verbose=False,
            )
            ctx = []
            for i, (ids, states) in enumerate(tokens):
                if list(ids) != list(tok["input_ids"][i]):
                    raise PosfairInputError(
                        f"the model tokenised a document differently from its tokenizer ({len(ids)} vs "
                        f"{len(tok['input_ids'][i])} tokens); token spans cannot be mapped"
                    )
                idx = token_segment_index(tok["offset_mapping"][i], spans[i], tok["special_tokens_mask"][i])
                ctx.append(contextualised_segments(states, idx, len(spans[i])).astype(np.float32))
            return pooled, ctx

        return enc.cached_documents(
            self._ns(calibration, "embedding"),
            self._ns(calibration, "contextualised") if retention else None,
            [d.text for d in inst.documents],
            [d.spans for d in inst.documents],
            compute,
            chunk_size=s.chunk_size,
            progress=tick,
        )


def _observations(
    inst: Instance,
    info: ModelInfo,
    label: str,
    key: str,
    setting: str,
    doc_vecs: np.ndarray,
    seg_vecs: dict[str, np.ndarray],
    ctx_vecs: np.ndarray | None,
    seg_tokens: dict[str, int],
    stock_doc_vecs: np.ndarray | None = None,
) -> pd.DataFrame:
    """The rows of one (instance, variant, setting); ``stock_doc_vecs`` None = the stock variant (drift 1)."""
    docs = inst.documents
    n = inst.n
    m = len(docs)
    seg_ids = [sid for d in docs for sid in d.segment_ids]
    seg_mat = np.stack([seg_vecs[s] for s in seg_ids]).reshape(m, n, -1)
    sigma = rowwise_cosine(np.repeat(doc_vecs[:, None, :], n, axis=1), seg_mat).ravel()
    tau = rowwise_cosine(seg_mat, ctx_vecs).ravel() if ctx_vecs is not None else np.full(m * n, np.nan)
    pool_ids = sorted(seg_vecs)
    pool_index = {s: i for i, s in enumerate(pool_ids)}
    set_segments: dict[str, set[str]] = {}
    for d in docs:
        set_segments.setdefault(d.set_id, set()).update(d.segment_ids)
    fid = fidelity_measures(
        doc_vecs,
        np.stack([seg_vecs[s] for s in pool_ids]),
        own=np.array([[pool_index[s] for s in d.segment_ids] for d in docs], dtype=np.int64),
        own_set=[np.array(sorted(pool_index[s] for s in set_segments[d.set_id]), dtype=np.int64) for d in docs],
        stock_docs=stock_doc_vecs,
    )
    cfg = inst.config
    return pd.DataFrame(
        {
            "model": info.name,
            "calibration": label,
            "calibration_key": key,
            "setting": setting,
            "n": n,
            "config": cfg.name,
            "config_key": cfg.key,
            "family": inst.family,
            "lead_lang": cfg.lead,
            "later_lang": cfg.later,
            "doc_id": np.repeat([d.doc_id for d in docs], n),
            "set_id": np.repeat([d.set_id for d in docs], n),
            "perm_index": np.repeat([d.perm_index for d in docs], n),
            "permutation": np.repeat(["-".join(map(str, d.permutation)) for d in docs], n),
            "position": np.tile(np.arange(1, n + 1), m),
            "segment_id": seg_ids,
            "topic": [t for d in docs for t in d.topics],
            "lang": [lg for d in docs for lg in d.langs],
            "seg_tokens": [seg_tokens[s] for s in seg_ids],
            "doc_tokens": np.repeat([d.n_tokens for d in docs], n),
            "sigma": sigma,
            "tau": tau,
            "other_cos": np.repeat(fid["other_cos"], n),
            "margin": sigma - np.repeat(fid["other_cos"], n),
            "recall": np.repeat(fid["recall"], n),
            "drift": np.repeat(fid["drift"], n),
        },
        columns=OBSERVATION_COLUMNS,
    )


def run_instances(
    model,
    instances: list[Instance],
    calibrations: Sequence[Calibration],
    store: EmbeddingStore,
    info: ModelInfo,
    settings: AuditSettings,
    progress: Callable[[str, int, int], Callable[[int], None]] | None = None,
    stock_layers: Any = None,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """Embed (through the cache) and measure every instance; returns (observations, timings).

    Each instance is encoded stock first, and the stock layers below the calibrations' first calibrated
    layers are computed once for all of them (``posfair.model.stock_layers``; the same numbers); ``stock_layers``:
    a ``FairModel.stock_layers_keeper()`` whose kept outputs serve (and outlive) this call, as the tuner's
    trials do.

    ``progress(description, total, already_done)`` may return a callback ``tick(k)``.
    """
    encoder = _Encoder(model, store, info, settings)
    variants: list[Resolved] = [STOCK, *calibrations]
    frames, timings = [], {}
    tokenizer = encoder.tokenizer
    with enc.max_seq_length(model, info.limit):
        for inst in instances:
            seg_ids, seg_texts, seg_tokens = _distinct_segments(inst, tokenizer)
            stock_segs: dict[str, np.ndarray] | None = None
            stock_docs: np.ndarray | None = None
            # stock first: its layers below the calibrations' first calibrated layer serve them all
            with enc.sharing_stock_layers(model, calibrations, into=stock_layers) as share:
                for cal in variants:
                    label, key = cal.label(), cal.key()
                    t0 = time.perf_counter()
                    if log.isEnabledFor(logging.INFO):
                        _log_cached(encoder, inst, cal, seg_texts)
                    total = len(seg_texts) + len(inst.documents)
                    raw = progress(f"{inst.label} {label}", total, 0) if progress else None
                    ticked = [0]

                    def tick(k: int, raw=raw, ticked=ticked) -> None:
                        ticked[0] += k
                        if raw is not None:
                            raw(k)

                    seg_mat = encoder.segments(seg_texts, cal, tick)
                    segs = dict(zip(seg_ids, seg_mat, strict=True))
                    doc_vecs, ctx_vecs = encoder.documents(inst, cal, tick)
                    if raw is not None and ticked[0] < total:  # what came from the cache was never ticked
                        raw(total - ticked[0])
                    timings[f"{inst.label} {label}"] = time.perf_counter() - t0
                    log.debug("%s, %s: encoded in %.1f s", inst.key, label, timings[f"{inst.label} {label}"])
                    frames.append(
                        _observations(inst, info, label, key, "main", doc_vecs, segs, ctx_vecs, seg_tokens, stock_docs)
                    )
                    if cal is STOCK:
                        stock_segs, stock_docs = segs, doc_vecs
                    elif settings.control:
                        frames.append(
                            _observations(
                                inst,
                                info,
                                label,
                                key,
                                "control",
                                doc_vecs,
                                stock_segs,
                                ctx_vecs,
                                seg_tokens,
                                stock_docs,
                            )
                        )
            if share is not None and stock_layers is None:
                log.debug("%s: %s", inst.key, share.summary())
    obs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=OBSERVATION_COLUMNS)
    return obs, timings


def _distinct_segments(inst: Instance, tokenizer) -> tuple[list[str], list[str], dict[str, int]]:
    """The instance's distinct segments: their ids (sorted), texts and token counts (no special tokens)."""
    seg_lookup: dict[str, str] = {}
    for d in inst.documents:
        seg_lookup.update(zip(d.segment_ids, d.texts, strict=True))
    seg_ids = sorted(seg_lookup)
    seg_texts = [seg_lookup[s] for s in seg_ids]
    lens = tokenizer(seg_texts, add_special_tokens=False, verbose=False)["input_ids"]
    return seg_ids, seg_texts, {s: len(ids) for s, ids in zip(seg_ids, lens, strict=True)}


def _log_cached(encoder: _Encoder, inst: Instance, cal: Resolved, seg_texts: list[str]) -> None:
    """How many of the instance's segments and documents the cache holds for ``cal`` (log level INFO)."""
    (n_seg, seg_hit), (n_doc, doc_hit) = (
        encoder.cached(seg_texts, cal),
        encoder.cached([d.text for d in inst.documents], cal),
    )
    log.info(
        "%s, %s: %d segments (%d cached), %d documents (%d cached)",
        inst.key,
        cal.label(),
        n_seg,
        seg_hit,
        n_doc,
        doc_hit,
    )


def default_calibrations(calibrations: Sequence[Calibration | str] | Calibration | str) -> list[Calibration]:
    """The calibrations an audit compares with stock (which it always runs): a Calibration or spec string ->
    [it], a sequence -> the parsed list (``[]`` = stock only)."""
    if calibrations is None or calibrations is STOCK:
        raise TypeError(
            f"calibrations must be a Calibration, a spec string or a list of them ([] = stock only); got {calibrations!r}"
        )
    if isinstance(calibrations, (Calibration, str)):
        calibrations = [calibrations]
    out = []
    for c in calibrations:
        out.append(c if isinstance(c, Calibration) else Calibration.parse(str(c)))
    labels = [c.label() for c in out]
    if len(set(labels)) != len(labels):
        raise PosfairInputError(f"duplicate calibrations: {labels}")
    return out


def make_model_info(model, settings: AuditSettings, name: str | None = None) -> ModelInfo:
    pooling = enc.model_pooling(model)
    limit = enc.model_limit(model, settings.max_seq_length)
    retention = settings.retention if settings.retention is not None else pooling == "mean"
    if name is None:
        name = display_name(model)
    with enc.max_seq_length(model, limit):  # the identity the embeddings are computed under
        fingerprint = model_fingerprint(model)
    return ModelInfo(name=str(name), fingerprint=fingerprint, pooling=pooling, limit=limit, retention=retention)
