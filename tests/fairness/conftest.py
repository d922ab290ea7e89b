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


def fidelity_by_hand(observations: pd.DataFrame) -> pd.DataFrame:
    """What ``fidelity.csv`` should hold, computed from the observations with plain pandas / NumPy, not with
    posfair's fidelity code: per (calibration, setting, n, config) the σ profile (the mean σ at each position), its
    spread (max - min), slope (least squares on the position) and max |β| (mean σ at p minus at 1: the position
    dummies' OLS estimates), the margin's profile and mean, and the per-document means of recall, drift and the
    cosine to the other sets (each document once)."""
    import numpy as np

    rows = []
    for (cal, setting, n, config), g in observations.groupby(["calibration", "setting", "n", "config"], sort=False):
        sigma = g.groupby("position")["sigma"].mean()
        margin = g.groupby("position")["margin"].mean()
        docs = g.groupby("doc_id")[["recall", "drift", "other_cos"]].first()
        row = dict(calibration=cal, setting=setting, n=n, config=config, documents=len(docs),
                   sets=g["set_id"].nunique(), spread=sigma.max() - sigma.min(),
                   slope=np.polyfit(sigma.index.to_numpy(dtype=float), sigma.to_numpy(), 1)[0],
                   max_abs_beta=(sigma.iloc[1:] - sigma.iloc[0]).abs().max(), other_cos=docs["other_cos"].mean(),
                   margin=g["margin"].mean(), recall=docs["recall"].mean(), drift=docs["drift"].mean())  # fmt: skip
        row.update({f"sigma_p{p}": sigma.get(p, np.nan) for p in range(1, n + 1)})
        row.update({f"margin_p{p}": margin.get(p, np.nan) for p in range(1, n + 1)})
        rows.append(row)
    return pd.DataFrame(rows)


def assert_matches_by_hand(written: pd.DataFrame, observations: pd.DataFrame) -> None:
    """Every number of :func:`fidelity_by_hand` equals the written frame's, row for row (what the writer adds beyond
    them -- config_key, calibrated_share -- is checked elsewhere)."""
    import numpy as np

    want = fidelity_by_hand(observations)
    assert len(written) == len(want) > 0
    keys = ["calibration", "setting", "n", "config"]
    assert written[keys].astype(str).values.tolist() == want[keys].astype(str).values.tolist()
    for column in want.columns.drop(keys):
        np.testing.assert_allclose(
            written[column].to_numpy(dtype=float), want[column].to_numpy(dtype=float), rtol=1e-9, atol=1e-12,
            err_msg=column,
        )  # fmt: skip
