"""Short queries and other languages on the held-out family: what the repair must keep beside the documents.

The held-out table (:mod:`posfair.repair.heldout`) judges documents: a search engine's queries are a few words, and
a multilingual index is asked in one language for passages in another.  :func:`query_changes` measures, on the
held-out family's sections, stock against the repair, each as a
:class:`~posfair.repair.heldout.RetrievalChange` (recall@1 in points, a paired bootstrap interval over the
family's sections):

* ``title -> section`` (every model): each English section's title, encoded as a query (the model's query prompt,
  e.g. "query: " for multilingual-e5-small; :func:`posfair.retrieval.evaluator.default_query_prompt`), against every
  English section of the family encoded as the model encodes documents; hit: the section it titles is nearest.
* where the corpus has sections in other languages than English, per language L pooled over the languages (a
  section's unit is its mean over the languages it exists in):

  - ``translation -> English``: a section in L (as a document) against the English sections: its English original
    is nearest;
  - ``title in L -> English``: a title in L (as a query) against the English sections;
  - ``English title -> L``: an English title (as a query) against the sections in L.

Sections are encoded at most :data:`PASSAGE_TOKENS` tokens long.  The cross-language measures are measured (and
enter the verdict, :func:`~posfair.repair.heldout.check_repair`) on the languages the model knows, those where
stock finds at least :data:`MULTILINGUAL_MIN` of the translations: an English model's recall across languages
says nothing of a repair (:meth:`QueryChecks.note` names the languages skipped).  Queries are encoded without the model's calibration (as
:class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` encodes them); a fine-tuned repair's queries
go through its new weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd

from posfair.calibration import MODEL_DEFAULT, STOCK
from posfair.encoding.passes import encode_texts, l2_normalize
from posfair.repair.heldout import RetrievalChange, measure_change
from posfair.retrieval.evaluator import default_query_prompt

__all__ = [
    "MULTILINGUAL_MIN",
    "PASSAGE_TOKENS",
    "QueryCase",
    "QueryChecks",
    "query_cases",
    "query_changes",
    "recall_hits",
]

#: the share of a family's translations in a language that stock must find (translation -> English recall@1) for the
#: language to be checked: below it the model does not know the language (an English model finds 40 to 80 % of
#: the bundled corpus's translations from the commands and names they share; multilingual-e5-small 99 to 100 %),
#: and the cross-language measures skip it, said so
MULTILINGUAL_MIN = 0.9
#: the most tokens of a section (as a query or a passage) these checks encode: a search index's passages are chunks of a
#: few hundred tokens, and a section's translation is found from its beginning
PASSAGE_TOKENS = 256
#: the measures' names as the tables write them
TITLE, TRANSLATION, TITLE_TO_EN, EN_TO_TITLE = (
    "title -> section",
    "translation -> English",
    "title in L -> English",
    "English title -> L",
)

#: (model, texts, as a query) -> unit-length embeddings
Encoder = Callable[[object, Sequence[str], bool], np.ndarray]


@dataclass(frozen=True)
class QueryCase:
    """One measure's queries against one pool of passages: ``relevant[i]`` is the passage index query ``i`` must find
    nearest; ``unit[i]`` the section it belongs to (the bootstrap's unit); ``as_query``: the queries are short
    queries (the query prompt, no calibration) rather than documents."""

    measure: str
    queries: tuple[str, ...]
    passages: tuple[str, ...]
    relevant: tuple[int, ...]
    unit: tuple[str, ...]
    as_query: bool
    lang: str = "en"


def query_cases(family: pd.DataFrame, lead: str = "en") -> list[QueryCase]:
    """The cases of the module's description from the held-out family's rows (columns ``id``, ``lang``, ``text``,
    ``title``; one row per section and language): the title case, then one case per other language and kind."""
    rows = family.drop_duplicates(["id", "lang"]).sort_values(["id", "lang"], kind="stable")
    by_lang = {lang: part.set_index("id") for lang, part in rows.groupby("lang", sort=True)}
    if lead not in by_lang:
        return []
    en = by_lang[lead]
    ids = tuple(en.index.astype(str))
    pos = {s: i for i, s in enumerate(ids)}
    sections = tuple(en["text"].astype(str))
    titled = [s for s in ids if str(en.at[s, "title"]).strip()]
    cases = [QueryCase(TITLE, tuple(str(en.at[s, "title"]) for s in titled), sections,
                       tuple(pos[s] for s in titled), tuple(titled), True)]  # fmt: skip
    for lang, part in by_lang.items():
        if lang == lead:
            continue
        shared = [s for s in part.index.astype(str) if s in pos]
        if not shared:
            continue
        local = tuple(str(part.at[s, "text"]) for s in shared)
        at = {s: i for i, s in enumerate(shared)}
        titles = [s for s in shared if str(part.at[s, "title"]).strip()]
        en_titles = [s for s in shared if str(en.at[s, "title"]).strip()]
        cases += [
            QueryCase(TRANSLATION, local, sections, tuple(pos[s] for s in shared), tuple(shared), False, lang),
            QueryCase(TITLE_TO_EN, tuple(str(part.at[s, "title"]) for s in titles), sections,
                      tuple(pos[s] for s in titles), tuple(titles), True, lang),
            QueryCase(EN_TO_TITLE, tuple(str(en.at[s, "title"]) for s in en_titles), local,
                      tuple(at[s] for s in en_titles), tuple(en_titles), True, lang),
        ]  # fmt: skip
    return cases


def recall_hits(queries: np.ndarray, passages: np.ndarray, relevant: Sequence[int]) -> np.ndarray:
    """Per query 1.0 when its relevant passage is the nearest (cosine of unit vectors; a tie counts against it),
    else 0.0."""
    sims = np.asarray(queries, np.float64) @ np.asarray(passages, np.float64).T
    rel = np.asarray(relevant, dtype=np.int64)
    own = sims[np.arange(len(rel)), rel]
    others = sims.copy()
    others[np.arange(len(rel)), rel] = -np.inf
    return (own > others.max(axis=1)).astype(np.float64)


@contextmanager
def _token_limit(model, tokens: int) -> Iterator[None]:
    """``model`` encoding at most ``tokens`` tokens per text for the duration (its own limit where lower); the
    truncation is these checks' design (:data:`PASSAGE_TOKENS`), so the encoder's warning of it is not repeated."""
    old = int(model.max_seq_length)
    model.max_seq_length = min(old, tokens)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"\d+ of \d+ texts are longer than max_seq_length=")
            yield
    finally:
        model.max_seq_length = old


def _encode(model, texts: Sequence[str], as_query: bool) -> np.ndarray:
    """Unit-length embeddings: a query with the model's query prompt and without its calibration, a document as the
    model encodes documents (its calibration, its default prompt), at most :data:`PASSAGE_TOKENS` tokens."""
    with _token_limit(model, PASSAGE_TOKENS):
        if as_query:
            vecs = encode_texts(model, list(texts), STOCK, prompt=default_query_prompt(model), batch_size=16)
        else:
            vecs = encode_texts(model, list(texts), MODEL_DEFAULT, batch_size=16)
    return l2_normalize(vecs.astype(np.float64))


@dataclass(frozen=True)
class QueryChecks:
    """What :func:`query_changes` measured: the changes (title -> section, then the cross-language measures over the
    languages the model knows), and stock's translation -> English recall@1 per language."""

    changes: tuple[RetrievalChange, ...]
    translations_found: dict[str, float]

    @property
    def checked_languages(self) -> tuple[str, ...]:
        """The languages the cross-language measures pool: stock finds :data:`MULTILINGUAL_MIN` of their
        translations."""
        return tuple(sorted(k for k, v in self.translations_found.items() if v >= MULTILINGUAL_MIN))

    @property
    def multilingual(self) -> bool:
        """Whether the model knows at least one language besides English (cross-language measures were made)."""
        return bool(self.checked_languages)

    def note(self) -> str | None:
        """A line naming the languages the cross-language checks skipped (None when none was)."""
        low = {k: v for k, v in self.translations_found.items() if v < MULTILINGUAL_MIN}
        if not low:
            return None
        shown = ", ".join(f"{k} {100 * v:.0f} %" for k, v in sorted(low.items(), key=lambda kv: kv[1]))
        what = "not a multilingual model" if not self.multilingual else "a language the model does not know"
        return (
            f"cross-language checks skip {len(low)} of {len(self.translations_found)} languages, where stock finds "
            f"under {100 * MULTILINGUAL_MIN:.0f} % of the held-out family's translations among its English "
            f"sections ({shown}): {what}"
        )


def query_changes(stock, repaired, family: pd.DataFrame, *, encode: Encoder = _encode, lead: str = "en") -> QueryChecks:
    """Stock against ``repaired`` on :func:`query_cases` of ``family`` (module description): per measure recall@1,
    per section the mean hit over its languages, paired over sections.  The cross-language measures pool the
    languages where stock's translation -> English recall@1 is at least :data:`MULTILINGUAL_MIN`;
    ``encode(model, texts, as_query)``: unit vectors (default: :func:`_encode`)."""
    cases = [c for c in query_cases(family, lead) if c.queries]
    cache: dict[tuple[int, tuple[str, ...], bool], np.ndarray] = {}

    def hits(model, case: QueryCase) -> np.ndarray:
        for texts, as_query in ((case.queries, case.as_query), (case.passages, False)):
            if (id(model), texts, as_query) not in cache:
                cache[id(model), texts, as_query] = encode(model, texts, as_query)
        q, p = cache[id(model), case.queries, case.as_query], cache[id(model), case.passages, False]
        return recall_hits(q, p, case.relevant)

    found = {c.lang: float(hits(stock, c).mean()) for c in cases if c.measure == TRANSLATION}
    per_unit: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for case in cases:
        if case.measure != TITLE and found.get(case.lang, 0.0) < MULTILINGUAL_MIN:
            continue
        units = per_unit.setdefault(case.measure, {})
        for u, s, r in zip(case.unit, hits(stock, case), hits(repaired, case), strict=True):
            units.setdefault(u, []).append((float(s), float(r)))
    changes = []
    for measure in (TITLE, TRANSLATION, TITLE_TO_EN, EN_TO_TITLE):
        if len(per_unit.get(measure, {})) < 2:
            continue
        means = np.array([np.mean(v, axis=0) for _, v in sorted(per_unit[measure].items())])
        changes.append(measure_change(measure, means[:, 0], means[:, 1]))
    return QueryChecks(tuple(changes), found)
