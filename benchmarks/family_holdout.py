"""Calibration variants tuned on one document family and tested on the other, with intervals (issue 27, items 2, 3, 6).

For each model, audit configuration and held-out family of the bundled corpus (``debian-faq``,
``installation-guide``): ``posfair.tune`` with ``test_family=`` searches every variant jointly on the other
family (dev) under the recall constraint, then evaluates stock, the chosen setting and each variant's best
feasible dev setting on the held-out family (test).  Each row gives, on the held-out family, the share of
stock's σ spread removed with its 95 % paired bootstrap interval over segment sets, recall@n's change from stock
with its interval, the constraint judged on the interval, the σ slope with its interval over the same sets,
whether its sign flipped from stock's, and its direction judged on the interval (as stock / unresolved / reversed:
``posfair.fairness.measures.slope_direction``, the rule the tuner's summary uses).

The goal the issue states: a setting that removes >= 80 % of the spread (the interval's lower end), without
reversing it (no reversal beyond noise: the slope's interval not wholly on the other side of zero), with
recall not lower (the recall change's interval includes 0 or lies above it), on a family it was not tuned on.
The ``goal`` column says whether a row meets it.

Usage (resumable: every trial and embedding is cached under --out)::

    python benchmarks/family_holdout.py --out fam-minilm
    python benchmarks/family_holdout.py --out fam-e5 --model bundled:multilingual-e5-small --configs en:3,de/en:3

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
from posfair.fairness.measures import reversal_text
from posfair.stats.intervals import interval_verdict
from posfair.store import EmbeddingStore
from posfair.tuning import DEV, TEST, FairnessObjective, default_fairness_settings, tune
from posfair.tuning.objectives import corpus_families

GOAL_REMOVED = 0.80


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=None, help="hub id, folder or bundled:multilingual-e5-small (default MiniLM)")
    ap.add_argument("--configs", default="en:3,en:4,de/en:3", help="CONFIG:N, mixed as LEAD/LATER")
    ap.add_argument("--families", default="each", help="held-out families, comma-separated, or 'each'")
    ap.add_argument("--max-drop", type=float, default=2.0, help="recall points the constraint allows on dev")
    ap.add_argument("--docs", type=int, default=120, help="documents per instance at n=3 (n=4: twice)")
    ap.add_argument("--max-seq-length", type=int, default=None, help="the model's token limit (default: its own)")
    add_space_options(ap, variants="uniform,prior,self,special,prior+special,self+special", layers="0.5,1.0")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    store = EmbeddingStore(args.out / "cache")
    model = posfair.load_model(args.model, max_seq_length=args.max_seq_length)
    space = search_space(args)
    rows = []
    for spec in args.configs.split(","):
        cfg, n = spec.rsplit(":", 1)
        cfg, n = cfg.replace("/", ":"), int(n)
        langs = sorted(set(cfg.split(":")))
        corpus = load_corpus(langs=langs)
        families = corpus_families(corpus) if args.families == "each" else args.families.split(",")
        for fam in families:
            settings = default_fairness_settings(
                n_values=(n,), configs=(cfg,), target_docs=args.docs * (2 if n == 4 else 1)
            )
            obj = FairnessObjective(model, corpus, settings, store=store, test_family=fam)
            t0 = time.perf_counter()
            folder = args.out / f"tune-{cfg.replace(':', '-')}-n{n}-test-{fam}"
            res = tune(model, objective=obj, space=space, max_drop=args.max_drop / 100, out_dir=folder)
            sets = {split: len(obj.split_sets(split)) for split in (DEV, TEST)}
            print(f"{spec}, test family {fam}: {time.perf_counter() - t0:.0f} s, sets dev {sets[DEV]} / test "
                  f"{sets[TEST]}, chosen {res.chosen_label}", flush=True)  # fmt: skip
            stock = res.trial(STOCK, TEST).metrics
            picks = [("chosen", res.chosen)] + [(v, c) for v, c in res.variant_best.items() if c is not None]
            picks += [(v, None) for v, c in res.variant_best.items() if c is None]
            for who, cal in picks:
                row = {"model": obj.info.name, "config": spec, "test family": fam, "sets dev/test": f"{sets[DEV]}/{sets[TEST]}",
                       "variant": who}  # fmt: skip
                if cal is None:
                    rows.append(row | {"setting": "— (no feasible dev setting)"})
                    continue
                if cal is STOCK:
                    rows.append(row | {"setting": "stock (nothing feasible)", "goal": "no"})
                    continue
                t = res.trial(cal, TEST).metrics
                iv = res.intervals.get(f"{TEST}:{cal.key()}", {})
                removed = 1 - t["spread"] / stock["spread"]
                reversed_ = reversal_text(stock["slope"], t["slope"], "") is not None
                verdict = interval_verdict(iv["guard_low"], iv["guard_high"], -res.max_drop) if iv else "—"
                # the goal: >= 80 % removed (interval's lower end), not reversed, recall not lower
                # (its interval includes zero or lies above it)
                direction = iv.get("direction", "—")
                goal = (
                    iv.get("effect_low", float("nan")) >= GOAL_REMOVED and direction != "reversed"
                    and iv["guard_high"] >= 0
                ) if iv else False  # fmt: skip
                rows.append(row | {
                    "setting": cal.label(),
                    "dev removed %": round(100 * (1 - res.trial(cal, DEV).metrics["spread"]
                                                  / res.trial(STOCK, DEV).metrics["spread"]), 1),
                    "test removed % [95 %]": f"{100 * removed:.0f} [{100 * iv['effect_low']:.0f}, "
                                             f"{100 * iv['effect_high']:.0f}]" if "effect_low" in iv else f"{100 * removed:.0f}",
                    "test Δrecall pts [95 %]": f"{100 * iv['guard_change']:+.1f} [{100 * iv['guard_low']:+.1f}, "
                                               f"{100 * iv['guard_high']:+.1f}]" if iv else "—",
                    "constraint on interval": verdict,
                    "slope stock → setting": f"{stock['slope']:+.4f} → {t['slope']:+.4f}",
                    "slope [95 %]": f"{iv['slope']:+.4f} [{iv['slope_low']:+.4f}, {iv['slope_high']:+.4f}]"
                                    if "slope_low" in iv else "—",
                    "sign flipped": "yes" if reversed_ else "no",
                    "direction": direction,
                    "goal": "yes" if goal else "no",
                })  # fmt: skip
    write_holdout_table(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
