"""Calibration variants tuned on the retrieval objective and tested on held-out documents, with intervals
(issue 27, items 3 and 6).

Builds the position-aware benchmark from the bundled corpus (as ``posfair build-benchmark``: documents of k
consecutive shuffled segments, every segment in exactly one document, the query of a segment its title) with
the model's own tokenizer and token limit, then ``posfair.tune`` with the retrieval objective: Harm of nDCG@10
over the answer's position groups, constrained on aggregate nDCG@10.  Dev and test are split by relevant
document (no document, hence no segment, is in both).  For stock, the chosen setting and each variant's best
feasible dev setting, the held-out test split's nDCG@10, Harm and PSI, and each change from stock with its 95 %
paired bootstrap interval over the test queries (:func:`posfair.retrieval.compare.differences_from_stock`, the
rule ``posfair retrieval`` reports with).

Usage (resumable: trials and embeddings are cached under --out)::

    python benchmarks/retrieval_holdout.py --out ret-minilm --max-seq-length 512
    python benchmarks/retrieval_holdout.py --out ret-e5 --model bundled:multilingual-e5-small

Prints one table and writes ``holdout.csv`` / ``holdout.md`` into --out.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import pandas as pd
from holdout_common import add_space_options, search_space, write_holdout_table

import posfair
from posfair.calibration import STOCK
from posfair.corpus import load_corpus
from posfair.retrieval.benchmarks import build_from_corpus, load_benchmark
from posfair.retrieval.compare import differences_from_stock
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.stats.intervals import interval_verdict
from posfair.store import EmbeddingStore
from posfair.tuning import DEV, TEST, RetrievalObjective, tune


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=None, help="hub id, folder or bundled:multilingual-e5-small (default MiniLM)")
    ap.add_argument("--max-seq-length", type=int, default=None, help="the model's token limit (default: its own)")
    ap.add_argument("--lang", default="en")
    ap.add_argument("--k", type=int, default=3, help="segments per document")
    ap.add_argument("--max-drop", type=float, default=1.0, help="nDCG@10 points the constraint allows on dev")
    add_space_options(ap, variants="uniform,prior,special,prior+special", layers="0.5")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    model = posfair.load_model(args.model, max_seq_length=args.max_seq_length)
    bench_dir = args.out / "bench"
    if not (bench_dir / "benchmark.json").exists():
        build_from_corpus(
            load_corpus(langs=[args.lang]),
            bench_dir,
            langs=[args.lang],
            k=args.k,
            max_doc_tokens=model.max_seq_length - model.special_token_count(),
            count_tokens=lambda texts: model.token_lengths(texts, add_special_tokens=False).tolist(),
            max_seq_length=model.max_seq_length,
        )
    bench = load_benchmark(str(bench_dir), lang=args.lang)
    store = EmbeddingStore(args.out / "cache")
    space = search_space(args)
    obj = RetrievalObjective(model, bench, store=store)
    t0 = time.perf_counter()
    res = tune(model, objective=obj, space=space, max_drop=args.max_drop / 100, out_dir=args.out / "tune")
    queries = {split: len(obj.splits[split].query_ids) for split in (DEV, TEST)}
    print(f"{bench.size().line()}; {time.perf_counter() - t0:.0f} s; queries dev {queries[DEV]} / test "
          f"{queries[TEST]}; chosen {res.chosen_label}", flush=True)  # fmt: skip

    def evaluated(calibration):
        ev = PositionalRetrievalEvaluator(obj.splits[TEST], calibration, store=store, report_fallback=False)
        return ev.evaluate(model)

    stock = evaluated(STOCK)
    picks = [("chosen", res.chosen)] + [(v, c) for v, c in res.variant_best.items()]
    rows = [{"variant": "stock", "setting": "stock", "nDCG@10": 100 * stock.metrics["ndcg@10"],
             "Harm": 100 * stock.metrics["harm"], "PSI": stock.metrics["psi"]}]  # fmt: skip
    for who, cal in picks:
        if cal is None or cal is STOCK:
            rows.append({"variant": who, "setting": "— (no feasible dev setting)" if cal is None else "stock"})
            continue
        got = evaluated(cal)
        d = differences_from_stock([stock, got]).iloc[0]
        rows.append({
            "variant": who,
            "setting": cal.label(),
            "nDCG@10": 100 * got.metrics["ndcg@10"],
            "Harm": 100 * got.metrics["harm"],
            "PSI": got.metrics["psi"],
            "ΔnDCG@10 [95 %]": f"{d.d_ndcg:+.2f} [{d.d_ndcg_low:+.2f}, {d.d_ndcg_high:+.2f}]",
            "constraint on interval": interval_verdict(d.d_ndcg_low / 100, d.d_ndcg_high / 100, -res.max_drop),
            "ΔHarm [95 %]": f"{d.d_harm:+.2f} [{d.d_harm_low:+.2f}, {d.d_harm_high:+.2f}] {d.harm_verdict}",
            "ΔPSI [95 %]": f"{d.d_psi:+.3f} [{d.d_psi_low:+.3f}, {d.d_psi_high:+.3f}] {d.psi_verdict}",
        })  # fmt: skip
    table = pd.DataFrame(rows).round({"nDCG@10": 2, "Harm": 2, "PSI": 3})
    table.insert(0, "model", obj.model_name)
    write_holdout_table(table, args.out)


if __name__ == "__main__":
    main()
