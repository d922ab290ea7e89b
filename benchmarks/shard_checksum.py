"""What checking a shard's checksum on first read would cost, against reading the vectors.

Issue #29 asked whether commands that read whole shards anyway (search, an audit's
lookups) could verify each shard's sha256 the first time a process reads it, catching
a byte flipped inside a shard whose size, mtime and inode were kept (today found only by
``posfair verify``).  The aim was at most 5 % of the time of reading 1,000,000 vectors.
This script writes a store of ``--rows`` x ``--dim`` float32 vectors in shards of
``--shard-rows`` (as ``posfair embed`` writes them), warms the page cache, then times in
one process, interleaved over ``--repeats`` rounds:

  read      every shard memory-mapped and its vectors read once (a dot product with one
            query per block of 32,768 rows, as the exact search streams them)
  checksum  ``ShardFile.verify()`` on every shard (sha256 over keys and vectors, and the
            finiteness check), what a check on first read would add

and prints the medians and their ratio.

    python benchmarks/shard_checksum.py                 # 1,000,000 x 384 (~1.5 GB in a temporary folder)
    python benchmarks/shard_checksum.py --rows 200000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--shard-rows", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the store (default: a temporary folder, removed)")
    args = ap.parse_args()

    from posfair.store import ShardFile, text_key, write_shard

    root = Path(args.dir or tempfile.mkdtemp(prefix="posfair-checksum-"))
    try:
        rng = np.random.default_rng(0)
        settings = {"namespace": {"model": "checksum-benchmark"}, "posfair_version": "bench", "code_hash": "bench"}
        for start in range(0, args.rows, args.shard_rows):
            stop = min(start + args.shard_rows, args.rows)
            vecs = rng.standard_normal((stop - start, args.dim), dtype=np.float32)
            write_shard(root, [text_key(f"text {i}") for i in range(start, stop)], vecs, settings=settings)
        paths = sorted(root.glob("part-*.arrow"))
        query = rng.standard_normal(args.dim).astype(np.float32)

        def read() -> float:
            t = time.perf_counter()
            total = 0.0
            for p in paths:
                v = ShardFile(p).vectors
                for s in range(0, len(v), 32768):
                    total += float((v[s : s + 32768] @ query).max())
            return time.perf_counter() - t

        def checksum() -> float:
            t = time.perf_counter()
            for p in paths:
                ShardFile(p).verify()
            return time.perf_counter() - t

        read(), checksum()  # warm the page cache
        times = {"read": [], "checksum": []}
        for _ in range(args.repeats):
            times["read"].append(read())
            times["checksum"].append(checksum())
        r, c = statistics.median(times["read"]), statistics.median(times["checksum"])
        print(f"{args.rows:,} x {args.dim} float32 in {len(paths)} shards, warm page cache, median of {args.repeats}")
        print(f"read every vector once      {r:7.2f} s")
        print(f"verify every shard          {c:7.2f} s")
        print(f"checksum on first read would add {c / r:.0%} to a full read (aim: <= 5 %)")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
