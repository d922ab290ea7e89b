"""Short queries and other languages in a repair's verdict (posfair.repair.queries), against hand computations."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from posfair.repair.heldout import HeldOut, RepairLimits, check_repair
from posfair.repair.queries import (
    EN_TO_TITLE,
    MULTILINGUAL_MIN,
    TITLE,
    TITLE_TO_EN,
    TRANSLATION,
    query_cases,
    query_changes,
    recall_hits,
)


def _family(ids=("s1", "s2", "s3", "s4"), langs=("en", "de", "zh")) -> pd.DataFrame:
    rows = [
        {"id": s, "lang": lang, "text": f"{lang} body of {s}", "title": f"{lang} title of {s}"}
        for s in ids
        for lang in langs
    ]
    return pd.DataFrame(rows)


def test_recall_hits_counts_the_relevant_passage_nearest_and_a_tie_against_it():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    p = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # passage 2 ties passage 0 for queries 0 and 2
    assert recall_hits(q, p, [0, 1, 1]).tolist() == [0.0, 1.0, 0.0]
    assert recall_hits(q[:2], p[:2], [0, 1]).tolist() == [1.0, 1.0]


def test_the_cases_pair_each_query_with_its_own_section():
    fam = _family(langs=("en", "de"))
    fam = fam[~((fam.lang == "de") & (fam.id == "s3"))]  # no German s3: it has no cross-language queries
    cases = {c.measure: c for c in query_cases(fam)}
    title = cases[TITLE]
    assert [title.passages[i] for i in title.relevant] == [f"en body of {s}" for s in title.unit]
    assert [q.replace("title", "body") for q in title.queries] == [title.passages[i] for i in title.relevant]
    tr = cases[TRANSLATION]
    assert tr.unit == ("s1", "s2", "s4") and not tr.as_query and tr.lang == "de"
    assert [tr.passages[i] for i in tr.relevant] == [f"en body of {s}" for s in tr.unit]
    back = cases[EN_TO_TITLE]
    assert back.queries == tuple(f"en title of {s}" for s in back.unit) and back.as_query
    assert [back.passages[i] for i in back.relevant] == [f"de body of {s}" for s in back.unit]
    assert cases[TITLE_TO_EN].queries == tuple(f"de title of {s}" for s in ("s1", "s2", "s4"))


def _vector(key: str, dim: int = 16) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
    v = np.random.default_rng(seed).normal(size=dim)
    return v / np.linalg.norm(v)


class _Model:
    """A stand-in model: a text's vector is its section's (every language, title or body alike: all found) unless
    the text is in ``lost`` (then a vector of its own: not found); ``multilingual`` False: a language other than
    English gets vectors of its own."""

    def __init__(self, lost=(), multilingual=True):
        self.lost, self.multilingual = set(lost), multilingual

    def encode(self, texts, as_query):
        out = []
        for t in texts:
            lang, section = t.split(" ")[0], t.split(" ")[-1]
            own = t in self.lost or (lang != "en" and not self.multilingual)
            out.append(_vector(t if own else section))
        return np.array(out)


def _encode(model, texts, as_query):
    return model.encode(texts, as_query)


def test_a_lost_title_is_a_drop_in_title_recall_and_fails_the_repair():
    fam = _family()
    stock, repaired = _Model(), _Model(lost={"en title of s2"})
    checks = query_changes(stock, repaired, fam, encode=_encode)
    assert checks.multilingual and checks.translations_found == {"de": 1.0, "zh": 1.0}
    by = {c.measure: c for c in checks.changes}
    assert set(by) == {TITLE, TRANSLATION, TITLE_TO_EN, EN_TO_TITLE}
    # title -> section: 4 sections, one lost: 100 -> 75 %
    assert (by[TITLE].stock, by[TITLE].repaired, by[TITLE].change) == (1.0, 0.75, pytest.approx(-25.0))
    # English title -> L: s2's English title is lost in both languages: per section the mean over de and zh
    assert by[EN_TO_TITLE].change == pytest.approx(-25.0)
    assert by[TRANSLATION].change == 0.0 and by[TITLE_TO_EN].change == 0.0
    held = HeldOut("f", 4, 4, (), checks.changes)
    failed = check_repair(held, RepairLimits(max_recall_drop=1.0))
    assert any(f.startswith("title -> section -25.0 points") for f in failed), failed
    assert any(f.startswith("English title -> L -25.0 points") for f in failed), failed


def test_a_loss_in_one_language_of_two_counts_half_for_its_section():
    checks = query_changes(_Model(), _Model(lost={"zh body of s1"}), _family(), encode=_encode)
    by = {c.measure: c for c in checks.changes}
    # s1: de found, zh lost -> 0.5; the other three sections 1.0: the mean falls by 0.5 / 4
    assert by[TRANSLATION].change == pytest.approx(-12.5)
    assert by[TRANSLATION].change_low <= by[TRANSLATION].change <= by[TRANSLATION].change_high


def test_a_model_that_finds_no_translations_gets_no_cross_language_checks_and_says_so():
    fam = _family(ids=tuple(f"s{i}" for i in range(12)))
    checks = query_changes(_Model(multilingual=False), _Model(multilingual=False), fam, encode=_encode)
    assert not checks.multilingual and [c.measure for c in checks.changes] == [TITLE]
    assert checks.translations_found["de"] < MULTILINGUAL_MIN
    note = checks.note()
    assert note and "skip 2 of 2 languages" in note and "not a multilingual model" in note


def test_only_the_languages_the_model_knows_are_checked():
    """A model that finds German translations and not Chinese ones: the cross-language measures are German's alone
    (a Chinese loss changes nothing), and the note names Chinese."""

    class GermanOnly(_Model):
        def encode(self, texts, as_query):
            return np.array(
                [
                    _vector(t) if t.startswith("zh ") else v
                    for t, v in zip(texts, super().encode(texts, as_query), strict=True)
                ]
            )

    fam = _family(ids=tuple(f"s{i}" for i in range(12)))
    checks = query_changes(GermanOnly(), GermanOnly(lost={"de body of s1"}), fam, encode=_encode)
    assert checks.checked_languages == ("de",) and checks.multilingual
    by = {c.measure: c for c in checks.changes}
    assert by[TRANSLATION].change == pytest.approx(-100 / 12)  # s1's only checked language lost
    note = checks.note()
    assert note and "skip 1 of 2 languages" in note and "zh" in note and "does not know" in note
    english = query_changes(_Model(), _Model(), fam[fam.lang == "en"], encode=_encode)
    assert english.note() is None and [c.measure for c in english.changes] == [TITLE]
