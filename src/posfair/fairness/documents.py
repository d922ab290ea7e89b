"""Experiment instances: segment sets, their n! orderings, and token-span bookkeeping.

An *experiment instance* ``(n, L)`` has ``n`` segments per document and a language
configuration ``L = (L_1, ..., L_n)``: monolingual ``(L, ..., L)`` or mixed
``(L_lead, L_later, ..., L_later)``.  A *segment set* is ``n`` distinct topics
(corpus ids present in every needed language).  Each set yields all ``n!``
orderings; in ordering ``j`` position ``i`` holds topic ``perm_j[i]`` written in
language ``L_i`` (so in mixed configurations the lead language always sits at
position 1, as in the paper).  Documents are the segments joined by
:data:`posfair.model.token_spans.SEGMENT_SEPARATOR` (one space).

Documents are never truncated: a set is used only if *every* ordering fits the
model's limit (special tokens included); sets that do not fit are counted in
:class:`SamplingReport`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from posfair.corpus.filters import default_length_window
from posfair.model.token_spans import added_token_count, join_segments, token_segment_index
from posfair.runtime.errors import PosfairInputError

__all__ = [
    "LanguageConfig",
    "SegmentSet",
    "Document",
    "SamplingReport",
    "Instance",
    "build_instance",
    "token_segment_index",
    "prepare_corpus",
    "language_grid",
    "config_label",
    "MIXED_CONFIG",
]


@dataclass(frozen=True)
class LanguageConfig:
    """A language configuration: ``lead`` at position 1 and ``later`` at positions 2..n."""

    lead: str
    later: str

    @classmethod
    def mono(cls, lang: str) -> LanguageConfig:
        return cls(lang, lang)

    @classmethod
    def parse(cls, spec: str) -> LanguageConfig:
        """``"en"`` (monolingual) or ``"LEAD:LATER"`` (mixed), e.g. ``"de:en"``."""
        parts = [p.strip() for p in spec.split(":")]
        if len(parts) == 1 and parts[0]:
            return cls.mono(parts[0])
        if len(parts) == 2 and all(parts):
            if parts[0] == parts[1]:
                return cls.mono(parts[0])
            return cls(parts[0], parts[1])
        raise PosfairInputError(f"language configuration must be 'LANG' or 'LEAD:LATER' (e.g. 'de:en'); got {spec!r}")

    @property
    def mixed(self) -> bool:
        return self.lead != self.later

    @property
    def name(self) -> str:
        """Column label as in the paper's tables: ``en`` or ``[de, en, ..., en]``."""
        return f"[{self.lead}, {self.later}, ..., {self.later}]" if self.mixed else self.lead

    @property
    def key(self) -> str:
        """File-name friendly identifier: ``en`` or ``de-en``."""
        return f"{self.lead}-{self.later}" if self.mixed else self.lead

    def langs(self, n: int) -> tuple[str, ...]:
        return (self.lead,) + (self.later,) * (n - 1)

    @property
    def needed(self) -> tuple[str, ...]:
        return (self.lead,) if not self.mixed else (self.lead, self.later)


#: a mixed configuration's key, ``[LEAD, LATER, ..., LATER]``
MIXED_CONFIG = re.compile(r"^\[(?P<lead>[^,\]]+), (?P<later>[^,\]]+), \.\.\., [^,\]]+\]$")


def config_label(config: str, n: int | None = None) -> str:
    """A language configuration (:attr:`LanguageConfig.name`) as a reader reads it for instances of ``n``
    segments: a mixed one (``[de, en, ..., en]``) in full where that is no longer (``[de, en, en]`` for n = 3,
    ``[de, en, en, en]`` for n = 4), the ellipsis only where it saves room or ``n`` is not one number; a
    monolingual one as it is."""
    m = MIXED_CONFIG.match(str(config))
    if not m or n is None:
        return str(config)
    full = "[" + ", ".join([m["lead"]] + [m["later"]] * (int(n) - 1)) + "]"
    return full if len(full) <= len(str(config)) else str(config)


def instance_label(n: int, config: str, family: str = "") -> str:
    """An instance as every output names it: ``n=3 en``, ``n=3 [de, en, en]`` (its configuration by
    :func:`config_label`), ``n=3 en (family debian-faq)``; :attr:`Instance.key` is its file-name form only."""
    return f"n={int(n)} {config_label(config, n)}" + (f" (family {family})" if family else "")


def language_grid(langs: Sequence[str]) -> tuple[LanguageConfig, ...]:
    """Every language configuration over ``langs``: the monolingual baseline of each language,
    then every ordered pair ``[lead, later, ..., later]`` with ``lead != later``.

    ``k`` languages give ``k`` monolingual and ``k * (k - 1)`` mixed configurations (the
    lead x later grid, its diagonal the monolingual baselines).  At least two distinct
    languages are needed.
    """
    codes = list(dict.fromkeys(str(x).strip() for x in langs))
    if any(not c for c in codes):
        raise PosfairInputError(f"language grid: empty language code in {list(langs)!r}")
    if len(codes) < 2:
        raise PosfairInputError(f"a language grid needs at least 2 languages; got {codes}")
    mono = tuple(LanguageConfig.mono(c) for c in codes)
    pairs = tuple(LanguageConfig(a, b) for a in codes for b in codes if a != b)
    return mono + pairs


@dataclass(frozen=True)
class SegmentSet:
    """``n`` distinct topics; ``set_id`` is unique within an audit."""

    set_id: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Document:
    """One ordering of a segment set.

    ``segment_ids[i]`` / ``texts[i]`` / ``langs[i]`` describe position ``i + 1``;
    ``spans[i]`` is the ``[start, end)`` character span of that segment in ``text``;
    ``permutation[i]`` is the index (into the set's topics) placed at position ``i + 1``.
    """

    doc_id: str
    set_id: str
    perm_index: int
    permutation: tuple[int, ...]
    topics: tuple[str, ...]
    segment_ids: tuple[str, ...]
    langs: tuple[str, ...]
    texts: tuple[str, ...]
    text: str
    spans: tuple[tuple[int, int], ...]
    n_tokens: int


@dataclass
class SamplingReport:
    """What was used and what was skipped while building one instance."""

    n: int
    config: str
    limit: int
    topics_available: int
    segments_outside_window: int
    sets_wanted: int
    sets_used: int = 0
    sets_skipped_too_long: int = 0
    documents: int = 0
    exhausted: bool = False
    topics_used: int = 0
    #: sets holding a topic that another set of the instance holds too (0 when the corpus allowed disjoint sets)
    sets_sharing_topics: int = 0
    notes: list[str] = field(default_factory=list)
    #: the document family the sets were drawn from ("" = the whole corpus)
    family: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sets_for(target_docs: int, n: int) -> int:
    """The segment sets an instance of ``n`` segments per document draws for ``target_docs`` documents:
    ``ceil(target_docs / n!)`` (each set gives all ``n!`` orderings)."""
    return math.ceil(target_docs / math.factorial(n))


def usable_topics(report: SamplingReport) -> int:
    """The topics an instance could draw its sets from: present in every needed language with segments
    inside the length window."""
    return report.topics_available - report.segments_outside_window


def more_sets_advice(report: SamplingReport, needed: int) -> str:
    """What would give an instance ``needed`` segment sets, by the rules that drew them: a larger target
    document count (:func:`sets_for`) only when the corpus has that many distinct sets of its usable topics
    (:func:`usable_topics`); else what the corpus allows; else (enough wanted and possible, too few fit
    the token limit) shorter segments or a smaller n."""
    n, usable = report.n, usable_topics(report)
    possible = math.comb(usable, n)
    if possible < needed:
        return (
            f"the corpus allows only {possible} distinct set(s) of {n} segments: it has {usable} usable topics "
            f"(present in every language the configuration needs, segments inside the length window); a larger "
            f"target document count cannot add sets: add topics to the corpus or use a smaller n"
        )
    if report.sets_wanted < needed:
        docs = next(t for t in range(1, needed * math.factorial(n) + 1) if sets_for(t, n) >= needed)
        return (
            f"raise the target document count to >= {docs} ({needed} sets of {math.factorial(n)} orderings; "
            f"the corpus has {usable} usable topics, {possible} distinct sets of {n})"
        )
    return (
        f"only {report.sets_used} of {report.sets_wanted} sets drawn fit the model limit of {report.limit} tokens "
        f"({report.sets_skipped_too_long} too long): use shorter segments (max segment tokens), a smaller n, "
        "or a model with a longer limit"
    )


@dataclass
class Instance:
    n: int
    config: LanguageConfig
    sets: list[SegmentSet]
    documents: list[Document]
    report: SamplingReport
    family: str = ""  # the document family its sets were drawn from ("" = the whole corpus)

    @property
    def key(self) -> str:
        """The instance in file names and records (``n3-de-en``); outputs a person reads say :attr:`label`."""
        return f"n{self.n}-{self.config.key}" + (f"@{self.family}" if self.family else "")

    @property
    def label(self) -> str:
        """The instance as every output names it (:func:`instance_label`): ``n=3 [de, en, en]``."""
        return instance_label(self.n, self.config.name, self.family)


def prepare_corpus(corpus: pd.DataFrame, family_field: str | None = None) -> pd.DataFrame:
    """Validate a corpus frame (``id, lang, text`` required) and normalise it.

    Texts are stripped (sentence-transformers strips inputs before tokenising,
    so spans must be computed on stripped text); empty texts are dropped;
    ``(id, lang)`` must be unique.  With ``family_field`` (e.g. ``"source"`` in the bundled
    corpus: the FAQ or the installation guide) that column becomes ``family``; every topic
    must belong to one family in all its languages.
    """
    missing = {"id", "lang", "text"} - set(corpus.columns)
    if missing:
        raise PosfairInputError(f"corpus is missing column(s) {sorted(missing)}; expected at least id, lang, text")
    if family_field is not None and family_field not in corpus.columns:
        raise PosfairInputError(
            f"family field {family_field!r}: the corpus has no such column (columns: {sorted(map(str, corpus.columns))})"
        )
    df = corpus.loc[:, [c for c in ("id", "lang", "text", "title") if c in corpus.columns]].copy()
    if family_field is not None:
        df["family"] = corpus[family_field].astype(str).to_numpy()
        mixed = df.groupby("id")["family"].nunique()
        if (mixed > 1).any():
            raise PosfairInputError(
                f"family field {family_field!r}: {int((mixed > 1).sum())} topics (first: {mixed.index[mixed > 1][0]!r}) "
                "have different families in different languages; a topic must belong to one family"
            )
    df["id"] = df["id"].astype(str)
    df["lang"] = df["lang"].astype(str)
    df["text"] = df["text"].astype(str).str.strip()
    df = df[df["text"].str.len() > 0]
    dup = df.duplicated(["id", "lang"])
    if dup.any():
        first = df.loc[dup, ["id", "lang"]].iloc[0].tolist()
        raise PosfairInputError(
            f"corpus has {int(dup.sum())} duplicate (id, lang) rows (first: {first}); ids must identify topics"
        )
    return df.reset_index(drop=True)


def _seed_for(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(h[:8], "little")


def _orderings(n: int) -> Iterator[tuple[int, ...]]:
    return itertools.permutations(range(n))


def _segment_lengths(
    tokenizer, text_of: dict[tuple[str, str], str], keys: Sequence[tuple[str, str]], cache: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """Token counts (no special tokens) of the segments ``keys`` = (topic, lang), added to ``cache``."""
    todo = [k for k in keys if k not in cache]
    if todo:
        enc = tokenizer([text_of[k] for k in todo], add_special_tokens=False, verbose=False)["input_ids"]
        cache.update((k, len(ids)) for k, ids in zip(todo, enc, strict=True))
    return cache


def _length_window(
    limit: int, n: int, n_special: int, low: int | None, high: int | None, window_ratio: float
) -> tuple[int, int]:
    """The segment-length window ``[low, cap]`` (unset bounds from :func:`default_length_window`; ``cap`` also
    keeps one segment within the limit)."""
    if high is None or low is None:
        dlow, dhigh = default_length_window(limit, n, special_tokens=n_special, min_ratio=window_ratio)
        low = dlow if low is None else low
        high = dhigh if high is None else high
    if low > high:
        raise PosfairInputError(f"segment-length window is empty: min {low} > max {high} tokens")
    return low, min(high, limit - n_special)


def _set_documents(
    pick: tuple[str, ...], set_id: str, lang_seq: tuple[str, ...], text_of: dict[tuple[str, str], str], tokenizer
) -> list[Document]:
    """The ``n!`` documents of one segment set (every ordering), with their token counts (special tokens included)."""
    docs = []
    for j, perm in enumerate(_orderings(len(pick))):
        topics = tuple(pick[k] for k in perm)
        texts = tuple(text_of[(t, lang)] for t, lang in zip(topics, lang_seq, strict=True))
        text, spans = join_segments(texts)
        docs.append(
            Document(
                doc_id=f"{set_id}-p{j:04d}",
                set_id=set_id,
                perm_index=j,
                permutation=tuple(perm),
                topics=topics,
                segment_ids=tuple(f"{lang}:{t}" for t, lang in zip(topics, lang_seq, strict=True)),
                langs=lang_seq,
                texts=texts,
                text=text,
                spans=tuple(spans),
                n_tokens=0,
            )
        )
    counts = tokenizer([d.text for d in docs], add_special_tokens=True, verbose=False)["input_ids"]
    return [replace(d, n_tokens=len(ids)) for d, ids in zip(docs, counts, strict=True)]


def _shortest_ordering(
    pick: tuple[str, ...], lang_seq: tuple[str, ...], lengths: dict[tuple[str, str], int], n_special: int
) -> int:
    """A lower bound on the tokens of any ordering of ``pick`` (the cheap check before tokenising its documents)."""
    n = len(pick)
    return n_special + min(
        lengths[(pick[k], lang_seq[0])] + sum(lengths[(pick[m], lang_seq[1])] for m in range(n) if m != k)
        for k in range(n)
    )


def build_instance(
    corpus: pd.DataFrame,
    n: int,
    config: LanguageConfig,
    *,
    tokenizer,
    limit: int,
    target_docs: int,
    seed: int = 0,
    min_segment_tokens: int | None = None,
    max_segment_tokens: int | None = None,
    window_ratio: float = 1 / 3,
    max_attempts_per_set: int = 200,
    token_lengths: dict[tuple[str, str], int] | None = None,
    family: str = "",
) -> Instance:
    """Draw segment sets for ``(n, config)`` and expand them into all ``n!`` documents.

    ``corpus`` must have gone through :func:`prepare_corpus`.  The number of sets
    is ``ceil(target_docs / n!)``.  ``limit`` is the model's maximum sequence
    length in tokens, special tokens included.  ``token_lengths`` optionally
    caches segment lengths (without special tokens) by ``(id, lang)``.

    Segment-length window: unset bounds come from
    :func:`posfair.corpus.filters.default_length_window` with ``min_ratio=window_ratio``
    (per-segment budget ``(limit - specials) // n``), so that documents of ``n``
    segments fit the limit by construction and segments have comparable lengths;
    every language version a set uses must lie in the window.

    Sets are drawn without reusing a topic across the sets of the instance while enough unused
    topics remain (observations of different sets are then independent, as clustering by set
    assumes); when the usable topics run out (fewer than ``n`` left, or ``max_attempts_per_set``
    draws in a row from them too long for the limit) later sets may reuse topics, and the report
    counts the sets that share one (``sets_sharing_topics``) with a note.

    ``family``: draw only from the topics of this family (``corpus["family"]``, see
    :func:`prepare_corpus`); its name prefixes the set ids and enters the sampling seed.
    """
    _check_instance_args(corpus, n, target_docs, config)
    pool = _topic_pool(
        corpus, n, config, tokenizer, limit, family, token_lengths, min_segment_tokens, max_segment_tokens, window_ratio
    )
    report = SamplingReport(
        n=n,
        config=config.name,
        limit=limit,
        topics_available=len(pool.topics_all),
        segments_outside_window=len(pool.topics_all) - len(pool.topics),
        sets_wanted=sets_for(target_docs, n),
        family=family,
    )
    where = f", family {family}" if family else ""
    if len(pool.topics) < n:
        raise PosfairInputError(
            f"instance (n={n}, {config.name}{where}): only {len(pool.topics)} topics are present in "
            f"{list(config.needed)} with segments of {pool.low}..{pool.cap} tokens (of {len(pool.topics_all)} topics in "
            f"all needed languages); need at least {n}"
        )
    rng = np.random.default_rng(_seed_for(seed, n, config.key, *((family,) if family else ())))
    prefix = f"{family}/" if family else ""
    chosen, docs, attempts = _draw_sets(pool, n, config, tokenizer, limit, rng, prefix, report, max_attempts_per_set)
    _note_shared_topics(report, chosen, len(pool.topics), n)
    report.sets_used, report.documents, report.exhausted = len(chosen), len(docs), len(chosen) < report.sets_wanted
    if not chosen:
        seg_lens = sorted(pool.lengths[(t, config.langs(n)[0])] for t in pool.topics)
        raise PosfairInputError(
            f"instance (n={n}, {config.name}{where}): no segment set fits the model limit of {limit} tokens "
            f"({report.sets_skipped_too_long} sets tried were too long; median segment length {seg_lens[len(seg_lens) // 2]} tokens). "
            "Use shorter segments (max segment tokens), a smaller n, or a model with a longer limit."
        )
    if report.exhausted:
        report.notes.append(
            f"only {len(chosen)} of {report.sets_wanted} segment sets found that fit {limit} tokens "
            f"after {attempts} draws ({report.sets_skipped_too_long} too long)"
        )
    sets = [SegmentSet(f"{prefix}n{n}-{config.key}-s{i:05d}", t) for i, t in enumerate(chosen)]
    return Instance(n=n, config=config, sets=sets, documents=docs, report=report, family=family)


def _check_instance_args(corpus: pd.DataFrame, n: int, target_docs: int, config: LanguageConfig) -> None:
    """``n``, the target document count and the configuration's languages, checked before any work."""
    if n < 2:
        raise PosfairInputError(f"n (segments per document) must be >= 2; got {n}")
    if target_docs < 1:
        raise PosfairInputError(f"target document count must be >= 1; got {target_docs}")
    langs_present = set(corpus["lang"].unique())
    for lang in config.needed:
        if lang not in langs_present:
            raise PosfairInputError(
                f"unknown language {lang!r} for configuration {config.name}: the corpus has {sorted(langs_present)}"
            )


@dataclass
class _TopicPool:
    """The topics an instance may draw from: ``topics_all`` (present in every needed language), ``topics`` (those
    whose segments all lie in the length window ``[low, cap]``), their texts and token lengths."""

    topics_all: list[str]
    topics: list[str]
    text_of: dict[tuple[str, str], str]
    lengths: dict[tuple[str, str], int]
    n_special: int
    low: int
    cap: int


def _topic_pool(
    corpus: pd.DataFrame,
    n: int,
    config: LanguageConfig,
    tokenizer,
    limit: int,
    family: str,
    token_lengths: dict[tuple[str, str], int] | None,
    min_segment_tokens: int | None,
    max_segment_tokens: int | None,
    window_ratio: float,
) -> _TopicPool:
    """The topics of ``config``'s languages (of ``family`` when given) and which of them fit the length window."""
    sub = corpus[corpus["lang"].isin(config.needed)]
    if family:
        if "family" not in sub:
            raise PosfairInputError(f"family {family!r} asked for, but the corpus was prepared without a family field")
        sub = sub[sub["family"] == family]
    counts = sub.groupby("id")["lang"].nunique()
    topics_all = sorted(counts.index[counts == len(config.needed)].tolist())
    text_of = {(r.id, r.lang): r.text for r in sub.itertuples(index=False)}
    keys = [(t, lang) for t in topics_all for lang in config.needed]
    lengths = _segment_lengths(tokenizer, text_of, keys, token_lengths if token_lengths is not None else {})
    n_special = added_token_count(tokenizer)
    low, cap = _length_window(limit, n, n_special, min_segment_tokens, max_segment_tokens, window_ratio)
    topics = [t for t in topics_all if all(low <= lengths[(t, lang)] <= cap for lang in config.needed)]
    return _TopicPool(topics_all, topics, text_of, lengths, n_special, low, cap)


def _draw_sets(
    pool: _TopicPool,
    n: int,
    config: LanguageConfig,
    tokenizer,
    limit: int,
    rng: np.random.Generator,
    prefix: str,
    report: SamplingReport,
    max_attempts_per_set: int,
) -> tuple[list[tuple[str, ...]], list[Document], int]:
    """Draw segment sets until ``report.sets_wanted`` fit ``limit`` (or the attempts or the distinct sets run out):
    the sets (sorted topics), their documents and the draws made; sets skipped as too long are counted in ``report``.

    Unused topics first while at least ``n`` remain and fewer than ``max_attempts_per_set`` draws in a row from
    them failed; then any usable topic."""
    topics, lang_seq = pool.topics, config.langs(n)
    chosen: list[tuple[str, ...]] = []
    seen: set[frozenset[str]] = set()
    used: set[str] = set()
    docs: list[Document] = []
    attempts, max_attempts = 0, max_attempts_per_set * report.sets_wanted
    fresh_failures = 0  # draws in a row from unused topics that did not fit
    total_sets = math.comb(len(topics), n)
    while len(chosen) < report.sets_wanted and attempts < max_attempts and len(seen) < total_sets:
        attempts += 1
        fresh = [t for t in topics if t not in used]
        disjoint = len(fresh) >= n and fresh_failures < max_attempts_per_set
        draw_from = fresh if disjoint else topics
        pick = tuple(draw_from[i] for i in sorted(rng.choice(len(draw_from), size=n, replace=False)))
        if frozenset(pick) in seen:
            fresh_failures += disjoint
            continue
        seen.add(frozenset(pick))
        if _shortest_ordering(pick, lang_seq, pool.lengths, pool.n_special) > limit:
            report.sets_skipped_too_long += 1
            fresh_failures += disjoint
            continue
        cand = _set_documents(pick, f"{prefix}n{n}-{config.key}-s{len(chosen):05d}", lang_seq, pool.text_of, tokenizer)
        if max(d.n_tokens for d in cand) > limit:
            report.sets_skipped_too_long += 1
            fresh_failures += disjoint
            continue
        fresh_failures = 0
        chosen.append(pick)
        used.update(pick)
        docs += cand
    return chosen, docs, attempts


def _note_shared_topics(report: SamplingReport, chosen: list[tuple[str, ...]], usable: int, n: int) -> None:
    """Count the topics used and the sets that share a topic with another set, with a note when any do."""
    holders: dict[str, int] = {}
    for pick in chosen:
        for t in pick:
            holders[t] = holders.get(t, 0) + 1
    report.topics_used = len(holders)
    report.sets_sharing_topics = sum(any(holders[t] > 1 for t in pick) for pick in chosen)
    if report.sets_sharing_topics:
        report.notes.append(
            f"{report.sets_sharing_topics} of {len(chosen)} segment sets share a topic with another set "
            f"({usable} usable topics; {len(chosen)} disjoint sets of {n} need {len(chosen) * n}): their "
            "observations are not independent, which clustering by set and topic accounts for"
        )
