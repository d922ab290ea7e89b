"""One extra token and the trailing-basket policy (issue 27 item 5), on the bundled model and corpus.

With mean pooling nothing is isolated, so a text of ``B*k + 1`` tokens (specials included) has a
last basket holding one token ([SEP]).  Under the papers' definition (``trailing="basket"``) that
token gets a whole basket's share of every calibrated row, while a ``B*k``-token text is calibrated
with k full baskets.  For each policy (``basket``, ``merge``, ``weighted``) this measures, on real
English sections of the bundled Debian corpus (the bundled all-MiniLM-L6-v2, B=128, the last half
of the layers, strengths 1 and 0.5):

* ``N`` tokens: the max abs component change and the cosine between the calibrated embedding of the
  ``N``-token text and its stock embedding (mean over texts; the max / min in brackets), for
  ``N = B*k`` and ``N = B*k + 1``: the "flip" is the jump between the two rows;
* ``step``: the same between the calibrated embeddings of the ``N``- and ``(N-1)``-token texts
  (what one extra token does), beside the stock model's own step.

The ``N``-token text is the section truncated to ``N`` tokens (specials included: the model's own
truncation, with ``max_seq_length = N``), so the ``(B*k+1)``-token text is the ``B*k``-token text plus
one real token.  ``merge`` moves the step where a new basket appears to ``N = B*(k+1)`` (two full
baskets out of one of 2B-1 keys): those rows are printed too.  Embeddings are normalised (the
model's Normalize module).  Runs offline; with 48 texts about 17 minutes on 2 shared cores
(every row of a mean-pooled model is calibrated; ``--texts 12`` takes a quarter of that):

    python benchmarks/trailing_policy.py [--texts 48] [--basket 128]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.corpus import load_corpus

POLICIES = ("basket", "merge", "weighted")
STRENGTHS = (1.0, 0.5)


def embed(model, texts: list[str], n_tokens: int, calibration) -> np.ndarray:
    """``texts`` truncated to exactly ``n_tokens`` tokens (specials included), embedded."""
    model.max_seq_length = n_tokens
    assert (model.encoded_lengths(texts) == n_tokens).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-basket texts' fallback warnings are what is measured here
        return model.encode(texts, calibration=calibration, batch_size=16, normalize_embeddings=True)


def compare(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text: the max abs component difference and the cosine (unit vectors)."""
    return np.abs(a - b).max(1), (a * b).sum(1)


def cell(d: np.ndarray, c: np.ndarray) -> str:
    return f"{d.mean():.4f} [{d.max():.4f}]  {c.mean():.5f} [{c.min():.5f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=48, help="English sections of at least 3B + 1 tokens")
    ap.add_argument("--basket", type=int, default=128)
    args = ap.parse_args()
    B = args.basket
    t0 = time.time()
    model = posfair.load_model(max_seq_length=512)
    df = load_corpus(langs="en")
    texts = df["text"].tolist()
    lengths = model.encoded_lengths(texts)
    texts = [t for t, n in zip(texts, lengths, strict=True) if n >= 3 * B + 1][: args.texts]
    if 3 * B + 1 > 512:
        raise SystemExit(f"B={B}: 3B + 1 tokens exceed the model's 512 positions")
    ns = sorted({B * k + d for k in (1, 2, 3) for d in (-1, 0, 1)})
    stock = {n: embed(model, texts, n, STOCK) for n in ns}
    print(
        f"{len(texts)} English sections of the bundled corpus, all-MiniLM-L6-v2 (mean pooling), B={B}, "
        f"the last half of the layers; cells: mean [max] of the max abs component change, mean [min] cosine"
    )
    for strength in STRENGTHS:
        print(f"\n## strength {strength:g}\n")
        print("| policy | N tokens | calibrated vs its stock | step N-1 -> N, calibrated | step N-1 -> N, stock |")
        print("|---|---|---|---|---|")
        for policy in POLICIES:
            cal = Calibration(basket_size=B, layers=0.5, strength=strength, trailing=policy)
            got = {n: embed(model, texts, n, cal) for n in ns}
            for n in ns:
                if n % B == B - 1:
                    continue  # only the step's left side
                d, c = compare(got[n], stock[n])
                sd, sc = compare(got[n], got[n - 1])
                td, tc = compare(stock[n], stock[n - 1])
                print(f"| {policy} | {n} | {cell(d, c)} | {cell(sd, sc)} | {cell(td, tc)} |")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
