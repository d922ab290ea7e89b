"""The ceiling of ``posfair fit --method finetune``'s objective on the held-out family, with no fitting.

The fine-tuning pulls every ordering of a segment set toward one target: the mean of the stock embeddings of
all the set's orderings.  This script puts each held-out document exactly on its set's target (stock
embeddings, averaged over the orderings) and judges that as ``posfair fit`` judges a repair (the same split,
the same :func:`posfair.repair.heldout.evaluate_repair` and :func:`~posfair.repair.heldout.check_repair`): what a
fit that reached its objective perfectly would show on documents it never saw.

Usage::

    python benchmarks/repair_ceiling.py                       # MiniLM and e5, the bundled corpus
    python benchmarks/repair_ceiling.py --models bundled --test-family installation-guide
"""

from __future__ import annotations

import argparse

import numpy as np

from posfair.calibration import STOCK
from posfair.corpus import load_corpus
from posfair.model import load_model
from posfair.repair.data import repair_split
from posfair.repair.heldout import RepairLimits, check_repair, evaluate_repair, heldout_lines, set_units


def ceiling(model_id: str, test_family: str | None, limit: int) -> list[str]:
    corpus = load_corpus(langs=["en"])
    stock = load_model(model_id, max_seq_length=limit)
    stock.set_calibration(STOCK)
    split = repair_split(stock, corpus, limit=limit, test_family=test_family)
    cache: dict[str, np.ndarray] = {}

    def encode(texts):
        missing = [t for t in dict.fromkeys(texts) if t not in cache]
        if missing:
            vecs = stock.encode(missing, batch_size=16, normalize_embeddings=True)
            cache.update(zip(missing, np.asarray(vecs, np.float64), strict=True))
        return np.stack([cache[t] for t in texts])

    target: dict[str, np.ndarray] = {}
    for inst in split.test:
        by_set: dict[str, list[np.ndarray]] = {}
        for d in inst.documents:
            by_set.setdefault(d.set_id, []).append(encode([d.text])[0])
        for d in inst.documents:
            mean = np.mean(by_set[d.set_id], axis=0)
            target[d.text] = mean / np.linalg.norm(mean)

    def on_target(texts):
        return np.stack([target[t] if t in target else encode([t])[0] for t in texts])

    stock_units = np.concatenate([set_units(i, encode) for i in split.test])
    units = np.concatenate([set_units(i, on_target) for i in split.test])
    docs = sum(len(i.documents) for i in split.test)
    h = evaluate_repair(stock_units, units, split.test[0].n, split.test_family, docs)
    lines = [f"{model_id}: held-out family {h.family}, {h.sets} sets, {h.documents} documents, {limit} tokens"]
    lines += ["  " + line for line in heldout_lines(h)]
    failures = check_repair(h, RepairLimits())
    lines.append("  checks: " + ("hold" if not failures else "fail: " + "; ".join(failures)))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bundled,bundled:multilingual-e5-small")
    ap.add_argument("--test-family", default=None)
    ap.add_argument("--max-seq-length", type=int, default=512)
    args = ap.parse_args()
    for model_id in args.models.split(","):
        print("\n".join(ceiling(model_id, args.test_family, args.max_seq_length)), flush=True)


if __name__ == "__main__":
    main()
