"""One attention layer, every row calibrated: the fused kernel's blocking against one stock SDPA call.

The fused all-rows kernel (``posfair.calibration.fused``) runs CPU flash attention with the
baskets laid out as heads and writes one partial output per basket; how many (sequence, head)
pairs and query rows go into one call decides how large those outputs are.  This script times
one layer (batch 1, 12 heads of 32, 128-key baskets, random float32 tensors), each blocking in
its own process (a fresh C allocator, as in a real encoding job), and prints each one's time
beside stock SDPA's and the minor page faults per call:

  stock      torch.nn.functional.scaled_dot_product_attention, all rows
  default    posfair's blocking (``fused._blocks``: outputs of about ``FUSED_TILE_BYTES`` per call)
  all-heads  every head in one call, 768-row query tiles: the blocking before, whose outputs
             (75 MB at 8,192 tokens) exceed glibc's mmap threshold and are page-faulted every call

    python benchmarks/fused_blocks.py                    # 2,048 and 8,192 tokens
    python benchmarks/fused_blocks.py --lengths 512 --repeats 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HEADS, DIM, BASKET = 12, 32, 128
BLOCKINGS = {"stock": None, "default": (None, None), "all-heads": (768, HEADS)}


def worker(length: int, blocking: str, repeats: int) -> dict:
    import torch

    from posfair import Calibration
    from posfair.calibration import fused
    from posfair.calibration.state import ForwardState

    torch.set_num_threads(int(os.environ.get("POSFAIR_BENCH_THREADS", "2")))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, length, DIM, generator=g) for _ in range(3))
    span = torch.zeros(1, dtype=torch.long), torch.full((1,), length - 1)
    cal = Calibration(basket_size=BASKET, layers=1.0, strength=0.5, queries="all").resolve("mean", 1)
    state = ForwardState(frozenset(), *span, calibration=cal, pooling="mean")
    scale = DIM**-0.5
    if BLOCKINGS[blocking] is None:
        run = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)  # noqa: E731
    else:
        rows, group = BLOCKINGS[blocking]
        run = lambda: fused.basket_attention(q, k, v, scale, state, tile_rows=rows, heads_per_call=group)  # noqa: E731
    with torch.no_grad():
        run()  # warm-up
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / repeats
    rows, group = fused._blocks(HEADS, length, -(-length // BASKET) * DIM * 4, *(BLOCKINGS[blocking] or (None, None)))
    return {"time": statistics.median(times), "faults": faults, "rows": rows, "heads": group}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        length, blocking, repeats = args.worker
        print(json.dumps(worker(int(length), blocking, int(repeats))))
        return
    print(
        f"one layer, batch 1, {HEADS} heads x {DIM}, {BASKET}-key baskets, every row calibrated; each line its own process"
    )
    print(f"{'L':>6} {'blocking':<10} {'rows x heads':>13} {'time ms':>9} {'vs stock':>9} {'faults/call':>12}")
    for length in args.lengths:
        res = {}
        for blocking in BLOCKINGS:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", str(length), blocking, str(args.repeats)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            res[blocking] = r = json.loads(out.stdout.strip().splitlines()[-1])
            shape = "-" if blocking == "stock" else f"{r['rows']} x {r['heads']}"
            ratio = r["time"] / res["stock"]["time"]
            print(
                f"{length:>6} {blocking:<10} {shape:>13} {r['time'] * 1e3:>9.1f} {ratio:>8.2f}x {r['faults']:>12.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
