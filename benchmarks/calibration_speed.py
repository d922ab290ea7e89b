"""What calibration costs in time and peak memory, measured in one run.

A random 12-layer, 384-wide XLM-RoBERTa-shaped model (seeded), batch 1, CPU.
For each sequence length every configuration runs in its own subprocess (so its
peak RSS is its own): one untimed warm-up pass, then ``--repeats`` forward passes,
and the median time is kept.

Configurations:
  plain        stock SDPA
  posfair-cls  posfair, CLS pooling: SDPA for all rows + the pooling row recomputed and calibrated
  naive-cls    eager full attention matrices with the same calibration applied to the post-softmax weights
  plain-mean   stock SDPA, mean pooling (same forward as plain)
  posfair-all  posfair, mean pooling: every valid query row calibrated, tiled over query rows
  naive-all    eager full matrices, every row calibrated (only at lengths <= --naive-all-max)

On transformers 5.x XLM-RoBERTa reaches posfair through the attention registry; on 4.x it
does not (it picks its SDPA / eager class itself), so there the posfair configurations go
through the fallback (the SDPA call of each attention module intercepted) and the naive ones
load XLM-R's own eager class; the last column names the mechanism.

Printed ratios: calibrated/plain (time, peak RSS) and naive/posfair (time, peak RSS).
Targets (issue 2): posfair-cls/plain <= 1.10 at 2048 and 8192; naive-cls/posfair-cls >= 3x time and
>= 4x memory at 8192; posfair-all/plain <= 2.5x time and <= 1.5x memory at 2048.

    python benchmarks/calibration_speed.py                      # 512, 2048, 8192
    python benchmarks/calibration_speed.py --lengths 512 2048 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAL = dict(basket_size=128, layers=0.5, strength=0.5)


def build_model(folder: Path, max_len: int) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer, XLMRobertaConfig

    from posfair.model import bundled_model_path

    cfg = XLMRobertaConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536,
        max_position_embeddings=max_len + 2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModel.from_config(cfg).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled_model_path()).save_pretrained(folder)


def worker(folder: str, config: str, length: int, repeats: int) -> dict:
    import torch

    import posfair

    torch.set_num_threads(int(os.environ.get("POSFAIR_BENCH_THREADS", "2")))
    pooling = "mean" if config.endswith(("mean", "all")) else "cls"
    model = posfair.load_model(folder, pooling=pooling, max_seq_length=length)
    model.eval()
    if config.startswith("naive"):
        if model.mechanism == "registry":
            model.transformer_module.set_attention_base("eager")
        else:  # transformers 4.x: XLM-R's own eager class (full matrices), calibrated through the fallback
            model = posfair.load_model(folder, pooling=pooling, max_seq_length=length, model_kwargs={"attn_implementation": "eager"})
            model.eval()
    cal = posfair.Calibration(**CAL) if not config.startswith("plain") else None
    g = torch.Generator().manual_seed(1)
    features = {
        "input_ids": torch.randint(1000, 30000, (1, length), generator=g),
        "attention_mask": torch.ones(1, length, dtype=torch.long),
    }
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    with torch.no_grad(), model.using(cal):
        model(dict(features))  # warm-up (allocator, kernel selection): not timed
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(dict(features))
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"config": config, "length": length, "time": statistics.median(times), "peak_mb": peak / 1024,
            "extra_mb": (peak - base_rss) / 1024, "mechanism": model.mechanism}  # fmt: skip


def run(folder: Path, config: str, length: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(folder), config, str(length), str(repeats)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--naive-all-max", type=int, default=2048, help="longest length for the naive all-rows run")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        folder, config, length, repeats = args.worker
        print(json.dumps(worker(folder, config, int(length), int(repeats))))
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "xlmr-12x384"
        build_model(folder, max(args.lengths))
        rows = []
        import sentence_transformers
        import transformers

        print(f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}")
        print(f"{'L':>6} {'config':<12} {'time s':>8} {'peak MB':>9} {'extra MB':>9}  mechanism")
        for L in args.lengths:
            res = {}
            configs = ["plain", "posfair-cls", "naive-cls", "plain-mean", "posfair-all"]
            if L <= args.naive_all_max:
                configs.append("naive-all")
            for c in configs:
                res[c] = run(folder, c, L, args.repeats)
                r = res[c]
                print(f"{L:>6} {c:<12} {r['time']:>8.2f} {r['peak_mb']:>9.0f} {r['extra_mb']:>9.0f}  {r['mechanism']}", flush=True)
            rows.append(res)

        print("\nratios measured in this run (time / peak RSS):")
        print(f"{'L':>6} {'cls calibrated/plain':>24} {'cls naive/posfair':>20} {'all calibrated/plain':>24} {'all naive/posfair':>20}")
        for res in rows:
            L = res["plain"]["length"]

            def ratio(a, b, res=res):
                return f"{res[a]['time'] / res[b]['time']:.2f}x / {res[a]['peak_mb'] / res[b]['peak_mb']:.2f}x"

            naive_all = ratio("naive-all", "posfair-all") if "naive-all" in res else "-"
            print(f"{L:>6} {ratio('posfair-cls', 'plain'):>24} {ratio('naive-cls', 'posfair-cls'):>20} "
                  f"{ratio('posfair-all', 'plain-mean'):>24} {naive_all:>20}")  # fmt: skip


if __name__ == "__main__":
    main()
