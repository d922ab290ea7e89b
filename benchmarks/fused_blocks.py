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
    python benchmarks/fused_blocks.py --parts --lengths 2048 --repeats 20   # where the time goes (issue 50, item 8)
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


def _layer(length: int):
    """One layer's queries, keys and values (batch 1, random, float32), its ForwardState and scale; sets the threads."""
    import torch

    from posfair import Calibration
    from posfair.calibration.state import ForwardState

    torch.set_num_threads(int(os.environ.get("POSFAIR_BENCH_THREADS", "2")))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, length, DIM, generator=g) for _ in range(3))
    span = torch.zeros(1, dtype=torch.long), torch.full((1,), length - 1)
    cal = Calibration(basket_size=BASKET, layers=1.0, strength=0.5, queries="all").resolve("mean", 1)
    state = ForwardState(frozenset(), *span, calibration=cal, pooling="mean")
    return q, k, v, state, DIM**-0.5


def parts(length: int, repeats: int) -> dict:
    """Where one layer's time goes (ms, medians of ``repeats`` passes alternating with stock SDPA's): the fused path
    at its default blocking, as :func:`posfair.calibration.fused.basket_attention` runs it, cut into the pairs' setup
    (``Pairs``, the per-basket layout), the flash calls, ``Pairs.combine`` (the masses, the basket formula, the
    weighted sum) and the writes into the output."""
    import torch
    import torch.nn.functional as F

    from posfair.calibration import fused

    q, k, v, state, scale = _layer(length)
    spent: dict[str, list[float]] = {"stock": []}

    def cut(times: dict, name: str, t: float) -> float:
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - t
        return now

    def fused_pass() -> None:
        times: dict[str, float] = {}
        t = time.perf_counter()
        p = fused.Pairs(q, k, v, state, None)
        keys, values = fused._per_basket(k, p), fused._per_basket(v, p)
        rows, group = fused._blocks(p.B * p.H, p.L, p.nb * p.D * 4, None, None)
        out = torch.empty(p.B, p.L, p.H, p.D, dtype=v.dtype)
        t = cut(times, "setup", t)
        blocks = fused._basket_outputs(q, keys, values, fused._slot_mask(p), scale, rows, group)
        for g0, g1, t0, t1, o, lse, qt in blocks:
            t = cut(times, "flash", t)
            acc = p.combine(o, lse, qt, scale, g0, g1)
            t = cut(times, "combine", t)
            fused._write_rows(out.transpose(1, 2), acc, g0, g1, t0, t1)
            t = cut(times, "write", t)
        for name, value in times.items():
            spent.setdefault(name, []).append(value)

    with torch.no_grad():
        for _ in range(repeats + 1):  # the first pass of each is the warm-up
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, scale=scale)
            stock = time.perf_counter() - t0
            fused_pass()
            spent["stock"].append(stock)
    return {name: statistics.median(t[1:]) * 1e3 for name, t in spent.items()}


def worker(length: int, blocking: str, repeats: int) -> dict:
    import torch

    from posfair.calibration import fused

    q, k, v, state, scale = _layer(length)
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
    ap.add_argument("--parts", action="store_true", help="in this process: where the default blocking's time goes")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parts:
        threads = os.environ.get("POSFAIR_BENCH_THREADS", "2")
        print(f"one layer, batch 1, {HEADS} heads x {DIM}, {BASKET}-key baskets, {threads} threads: ms, medians")
        for length in args.lengths:
            ms = parts(length, args.repeats)
            fused_ms = sum(v for name, v in ms.items() if name != "stock")
            print(f"{length:>6} stock {ms['stock']:.1f}, fused {fused_ms:.1f} ({fused_ms / ms['stock']:.2f}x): "
                  + ", ".join(f"{name} {v:.1f}" for name, v in ms.items() if name != "stock"), flush=True)  # fmt: skip
        return
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
