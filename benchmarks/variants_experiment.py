"""The calibration-variants experiment (issue 16) on the bundled model and corpus.

Tunes every variant jointly (uniform, positional prior, self-attention share, special-token
mass) with the fairness objective on the *installation guide* family of the bundled corpus
(dev split; test split for confirmation), for English n=3, English n=4 and one mixed
configuration; then measures each variant's best feasible setting of the English n=3 search
on the *Debian FAQ* family (not used for tuning; both of its splits, equal-weighted) and on
the retrieval benchmark built from the bundled English sections (Harm / PSI of nDCG@10).

Usage (resumable: every trial and embedding is cached under --out):

    python benchmarks/variants_experiment.py --out variants-run [--configs en:3,en:4,fr/en:3] [--max-drop 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import pandas as pd

import posfair
from posfair import Calibration
from posfair.corpus import load_corpus
from posfair.retrieval.benchmarks import build_from_corpus, load_benchmark
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.store import EmbeddingStore
from posfair.tuning import DEV, TEST, FairnessObjective, SearchSpace, default_fairness_settings, tune

METRICS = ("spread", "recall", "margin", "drift")


def family(source: str):
    df = load_corpus()
    return df[df["source"] == source].reset_index(drop=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default="en:3,en:4,fr/en:3", help="LANGCONFIG:N, mixed as LEAD/LATER")
    ap.add_argument("--max-drop", type=float, default=1.0, help="recall points")
    ap.add_argument("--baskets", default="16,64")
    ap.add_argument("--layers", default="0.5,1.0")
    ap.add_argument("--strengths", default="0.5,1.0")
    ap.add_argument("--self-shares", default="1.0")
    ap.add_argument("--fine-rounds", type=int, default=2)
    ap.add_argument(
        "--combined",
        action="store_true",
        help="only: prior + special('original') together (English n=3, dev then test)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = EmbeddingStore(out / "cache")
    model = posfair.load_model()
    tune_corpus, held_out = family("installation-guide"), family("debian-faq")
    if args.combined:
        return combined(model, tune_corpus, store, out, args.max_drop / 100)
    space = SearchSpace(
        basket_sizes=tuple(int(x) for x in args.baskets.split(",")),
        layer_sets=tuple(float(x) if "." in x else int(x) for x in args.layers.split(",")),
        strengths=tuple(float(x) for x in args.strengths.split(",")), fine_rounds=args.fine_rounds,
        variants=("uniform", "prior", "self", "special"), self_shares=tuple(float(x) for x in args.self_shares.split(",")),
        special_shares=("original",),
    )  # fmt: skip
    rows, results = [], {}
    for spec in args.configs.split(","):
        cfg, n = spec.rsplit(":", 1)
        cfg = cfg.replace("/", ":")
        n = int(n)
        docs = 120 if n == 3 else 240  # n=4: 24 orderings per set -> 10 segment sets (5 dev, 5 test)
        settings = default_fairness_settings(n_values=(n,), configs=(cfg,), target_docs=docs)
        obj = FairnessObjective(model, tune_corpus, settings, store=store)
        t0 = time.perf_counter()
        res = tune(model, objective=obj, space=space, max_drop=args.max_drop / 100, out_dir=out / f"tune-{cfg.replace(':', '-')}-n{n}",
                   log=print)  # fmt: skip
        print(f"{spec}: {time.perf_counter() - t0:.0f} s, chosen {res.chosen_label}", flush=True)
        results[spec] = (res, obj)
        stock_dev = res.trial(None, DEV).metrics
        stock_test = res.trial(None, TEST).metrics
        for v, cal in [("stock", None), *res.variant_best.items()]:
            if v != "stock" and cal is None:
                rows.append({"config": spec, "variant": v, "setting": "— (no feasible dev setting)"})
                continue
            d, t = res.trial(cal, DEV).metrics, res.trial(cal, TEST).metrics
            rows.append({
                "config": spec, "variant": v, "setting": "stock" if cal is None else cal.label(),
                "dev spread": d["spread"], "dev recall": d["recall"],
                **{f"test {m}": t[m] for m in METRICS},
                "test spread removed %": 100 * (1 - t["spread"] / stock_test["spread"]),
                "test recall loss pts": 100 * (stock_test["recall"] - t["recall"]),
                "dev spread removed %": 100 * (1 - d["spread"] / stock_dev["spread"]),
            })  # fmt: skip
    table = pd.DataFrame(rows)
    table.to_csv(
        out / f"test_split-{args.configs.replace(':', '-').replace('/', '-').replace(',', '_')}.csv", index=False
    )
    print(table.to_string())
    if "en:3" not in results:
        return
    # the held-out family and the retrieval benchmark: each variant's best of the English n=3 search
    res, _ = results["en:3"]
    cals = [("stock", None)] + [(v, c) for v, c in res.variant_best.items() if c is not None]
    faq = FairnessObjective(
        model, held_out, default_fairness_settings(n_values=(3,), configs=("en",), target_docs=120), store=store
    )
    budget = model.max_seq_length - model.special_token_count()
    bench_path = build_from_corpus(load_corpus(langs="en"), out / "bench", langs=["en"], k=3, max_doc_tokens=budget,
                                   count_tokens=lambda t: model.token_lengths(t, add_special_tokens=False).tolist())  # fmt: skip
    bench = load_benchmark(str(bench_path), lang="en")
    more = []
    for v, cal in cals:
        m = [faq.evaluate(cal, split) for split in (DEV, TEST)]
        r = PositionalRetrievalEvaluator(bench, cal, store=store).evaluate(model)
        more.append({"variant": v, "setting": "stock" if cal is None else cal.label(),
                     **{f"faq {k}": (m[0][k] + m[1][k]) / 2 for k in METRICS},
                     "harm": r.metrics["harm"], "psi": r.metrics["psi"], "ndcg@10": r.metrics["ndcg@10"]})  # fmt: skip
    held = pd.DataFrame(more)
    s0 = held.iloc[0]
    held["faq spread removed %"] = 100 * (1 - held["faq spread"] / s0["faq spread"])
    held["faq recall loss pts"] = 100 * (s0["faq recall"] - held["faq recall"])
    held.to_csv(out / "held_out.csv", index=False)
    print(held.to_string())
    (out / f"run-{args.configs.replace(':', '-').replace('/', '-').replace(',', '_')}.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(out)}, "space": space.to_dict()}, indent=1)
    )


def combined(model, corpus, store, out: Path, max_drop: float) -> None:
    """Prior and special-token mass together (not a tuner variant): a few strengths of the prior variant's
    best line with BOS/EOS isolated at their original mass; chosen on dev under the same constraint, then test."""
    obj = FairnessObjective(
        model, corpus, default_fairness_settings(n_values=(3,), configs=("en",), target_docs=120), store=store
    )
    prior = obj.estimate_prior()
    stock = {split: obj.evaluate(None, split) for split in (DEV, TEST)}
    rows = []
    for a in (0.75, 0.875, 1.0):
        cal = Calibration(basket_size=16, layers=0.5, strength=a, prior=prior).with_special("original")
        rows.append((cal, obj.evaluate(cal, DEV)))
        print(cal.label(), rows[-1][1]["spread"], rows[-1][1]["recall"], flush=True)
    ok = [(c, m) for c, m in rows if m["recall"] >= stock[DEV]["recall"] - max_drop - 1e-12]
    cal, dev = min(ok or rows, key=lambda r: r[1]["spread"])
    test = obj.evaluate(cal, TEST)
    table = pd.DataFrame([
        {"setting": c.label(), "dev spread": m["spread"], "dev recall": m["recall"], "feasible": (c, m) in ok, "chosen": c == cal} for c, m in rows
    ])  # fmt: skip
    table.to_csv(out / "combined_dev.csv", index=False)
    summary = {"chosen": cal.label(), **{f"test {k}": test[k] for k in METRICS},
               "test spread removed %": 100 * (1 - test["spread"] / stock[TEST]["spread"]),
               "test recall loss pts": 100 * (stock[TEST]["recall"] - test["recall"])}  # fmt: skip
    (out / "combined_test.json").write_text(json.dumps(summary, indent=1))
    print(table.to_string(), json.dumps(summary, indent=1), sep="\n")


if __name__ == "__main__":
    main()
