"""The repair methods side by side (issue 47): each fitted by ``posfair fit`` on the same split, judged by the
same held-out checks.

For every (model, method) pair: ``posfair fit --method M --save-anyway`` in a fresh process (its peak resident memory is
its own), then the held-out table of all of them, the figure (bias removed against the retrieval change, one
point per method with its intervals) and a timing table: fit time, peak resident memory, encode cost of the
repaired model against stock (measured in the fit's own run, interleaved).  Resumable: a pair whose
``heldout.json`` exists under --out is read, not refitted (delete its folder to refit).

Usage::

    python benchmarks/repair_methods.py --out repair-bench
    python benchmarks/repair_methods.py --out repair-bench --models bundled:multilingual-e5-small --methods finetune,grid

Prints the tables and writes ``repair_methods.md`` and ``tradeoff.png`` into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from posfair.repair.figure import repair_tradeoff
from posfair.repair.fitting import FitResult, heldout_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="bundled,bundled:multilingual-e5-small")
    ap.add_argument("--methods", default="finetune,learned,tempscale,grid")
    ap.add_argument("--test-family", default=None)
    ap.add_argument(
        "--calibrations", default="", help="fixed settings judged as they are (no fit), ';'-separated specs"
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results, timing = [], []
    for model in args.models.split(","):
        for method in [m for m in args.methods.split(",") if m]:
            folder = args.out / f"{model.replace(':', '-')}-{method}"
            record = folder / "fit" / "heldout.json"
            if not record.exists():
                cmd = [sys.executable, "-m", "posfair.cli", "fit", "-m", model, "-o", str(folder), "--method", method,
                       "--save-anyway"] + (["--test-family", args.test_family] if args.test_family else [])  # fmt: skip
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, check=False)
                print(f"{model} {method}: exit {proc.returncode}, {time.perf_counter() - t0:.0f} s", flush=True)
                if not record.exists():
                    continue
            res = FitResult.from_dict(json.loads(record.read_text()))
            results.append(res)
            timing.append({
                "model": res.model, "method": method, "fit s": round(res.fit_seconds),
                "peak RSS MiB": round(res.peak_rss_mib),
                "encode / stock": f"{res.encode_ratio:.2f}x", "held-out checks": "holds" if res.holds else "fails",
            })  # fmt: skip
    for model in args.models.split(",") if args.calibrations else []:
        for spec in args.calibrations.split(";"):
            res = fixed_setting(model, spec, args.test_family)
            results.append(res)
            timing.append({"model": res.model, "method": res.method, "fit s": 0, "peak RSS MiB": "—",
                           "encode / stock": f"{res.encode_ratio:.2f}x",
                           "held-out checks": "holds" if res.holds else "fails"})  # fmt: skip
    if not results:
        sys.exit("no fit finished")
    table = heldout_markdown(results)
    timing_md = pd.DataFrame(timing).to_markdown(index=False) + "\n"
    (args.out / "repair_methods.md").write_text(table + "\n" + timing_md, encoding="utf-8")
    repair_tradeoff(results, args.out / "tradeoff")
    print(table)
    print(timing_md)


def fixed_setting(model_id: str, spec: str, test_family: str | None) -> FitResult:
    """A calibration judged on the held-out family exactly as a fit is (no fitting: the papers' settings)."""
    import numpy as np

    import posfair
    from posfair.calibration import STOCK, Calibration
    from posfair.corpus import load_corpus
    from posfair.repair.data import repair_split
    from posfair.repair.fitting import _encode_ratio, _encoder
    from posfair.repair.heldout import RepairLimits, check_repair, evaluate_repair, set_units

    stock = posfair.load_model(model_id, max_seq_length=512)
    stock.set_calibration(STOCK)
    split = repair_split(stock, load_corpus(langs=["en"]), limit=512, test_family=test_family)
    cal = Calibration() if spec == "default" else Calibration.parse(spec)
    calibrated = posfair.load_model(model_id, max_seq_length=512)
    calibrated.set_calibration(cal)
    units = [np.concatenate([set_units(i, _encoder(m)) for i in split.test]) for m in (stock, calibrated)]
    h = evaluate_repair(units[0], units[1], split.test[0].n, split.test_family,
                        sum(len(i.documents) for i in split.test))  # fmt: skip
    limits = RepairLimits()
    ratio = _encode_ratio(stock, calibrated, [d.text for i in split.test for d in i.documents])
    return FitResult(f"fixed {cal.label()}", model_id, split.test_family, split.counts(), {"calibration": cal.spec()},
                     h, None, check_repair(h, limits), False, 0.0, ratio, "", limits)  # fmt: skip


if __name__ == "__main__":
    main()
