"""Fixtures of the fairness tests: a tiny aligned corpus written by the tests."""

from __future__ import annotations

import random

import pandas as pd
import pytest

EN = ("apple river mountain code kernel package network music theory garden history science engine window printer "
      "driver server memory screen keyboard cable bridge forest ocean planet").split()  # fmt: skip
DE = ("apfel fluss berg quelle kern paket netz musik theorie garten geschichte wissen motor fenster drucker treiber "
      "rechner speicher bildschirm tastatur kabel bruecke wald meer planet").split()  # fmt: skip


def tiny_corpus(
    topics: int = 10, seed: int = 0, min_words: int = 8, max_words: int = 20, langs=("en", "de")
) -> pd.DataFrame:
    rnd = random.Random(seed)
    rows = []
    for t in range(topics):
        k = rnd.randint(min_words, max_words)
        for lang in langs:
            words = EN if lang == "en" else DE
            text = " ".join(rnd.choice(words) for _ in range(k)).capitalize() + "."
            rows.append({"id": f"topic{t:02d}", "lang": lang, "title": f"Topic {t}", "text": text})
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def make_corpus():
    return tiny_corpus
