"""Scale of the embedding store: open, look up and search a store of ``--rows`` x ``--dim`` float32 vectors.

Builds a store in a temporary folder (or ``--dir``) the way ``posfair embed`` does
(``write_shard`` into the namespace folder, ``--shard-rows`` rows per shard, random
vectors, keys = ``text_key`` of a text), then measures, each phase in a fresh Python
process (RSS baseline taken after the imports) and on a warm page cache:

  first open   EmbeddingStore(root).namespace(...) on the store as written (with the
               Arrow store: every shard verified, the key index built and written)
  open         the same again (index present: shards trusted by size + mtime)
  lookup       ns.get() of --lookups random stored keys, right after the open
  search       exact top-10 of --queries queries over every stored vector (streamed
               shard by shard; the previous store searched its in-RAM arrays)

RSS is the process's resident set (``VmRSS``) growth over the baseline; ``anon`` is its
anonymous part (``RssAnon``: heap, copies), the rest being pages of memory-mapped
shard files (page cache the kernel can drop).  Targets (issue #15, at 1,000,000 x 384):
open < 2 s and < 200 MB RSS, 10,000 lookups < 1 s; the search target here is
bounded memory: anonymous growth < 200 MB whatever the corpus size.

    python benchmarks/store_scale.py                    # 1,000,000 x 384 (~1.5 GB on disk; a few minutes)
    python benchmarks/store_scale.py --rows 100000      # quicker
    PYTHONPATH=/path/to/old/src python benchmarks/store_scale.py --rows 100000   # another posfair's store
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

META = {"model": "store-scale-benchmark"}


def mem() -> dict[str, float]:
    """VmRSS / RssAnon / RssFile of this process, in MB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(value.split()[0]) / 1024
    return out


class Peak:
    """Samples memory every few ms in a thread; ``peak`` holds the highest VmRSS / RssAnon seen."""

    def __enter__(self):
        self.peak = mem()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            m = mem()
            for k in m:
                self.peak[k] = max(self.peak[k], m[k])

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        m = mem()
        for k in m:
            self.peak[k] = max(self.peak[k], m[k])


def keys_for(start: int, stop: int) -> list[str]:
    from posfair.store import text_key

    return [text_key(f"document number {i}") for i in range(start, stop)]


def build(root: str, rows: int, dim: int, shard_rows: int) -> float:
    from posfair.store import EmbeddingStore, write_shard

    ns_dir = EmbeddingStore(root).namespace_dir(**META)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for n, start in enumerate(range(0, rows, shard_rows)):
        stop = min(rows, start + shard_rows)
        vectors = rng.standard_normal((stop - start, dim), dtype=np.float32)
        write_shard(ns_dir, keys_for(start, stop), vectors, name=f"{n:07d}")
    return time.perf_counter() - t0


def phase(root: str, rows: int, lookups: int, queries: int, dim: int, with_work: bool) -> dict:
    """One measured process: open, then (``with_work``) lookups and the search."""
    import posfair.retrieval.search as search
    from posfair.store import EmbeddingStore

    base = mem()
    out: dict = {}
    with Peak() as p:
        t0 = time.perf_counter()
        ns = EmbeddingStore(root).namespace(**META)
        out["open_s"] = time.perf_counter() - t0
    out["open_rss"] = p.peak["VmRSS"] - base["VmRSS"]
    out["open_anon"] = p.peak["RssAnon"] - base["RssAnon"]
    out["len"] = len(ns)
    if not with_work:
        return out
    rng = np.random.default_rng(1)
    picks = rng.choice(rows, size=min(lookups, rows), replace=False)
    wanted = [keys_for(int(i), int(i) + 1)[0] for i in picks]
    t0 = time.perf_counter()
    got = ns.get(wanted)
    out["lookup_s"] = time.perf_counter() - t0
    out["lookup_shape"] = list(got.shape)
    q = rng.standard_normal((queries, dim), dtype=np.float32)
    before = mem()
    with Peak() as p:
        t0 = time.perf_counter()
        if hasattr(search, "stored_topk"):
            keys, _ = search.stored_topk(q, ns, k=10)
        else:  # the previous store: its vectors are in RAM already
            idx, _ = search.exact_topk(q, np.concatenate(ns._shards), k=10)
        out["search_s"] = time.perf_counter() - t0
    out["search_rss"] = p.peak["VmRSS"] - before["VmRSS"]
    out["search_anon"] = p.peak["RssAnon"] - before["RssAnon"]
    out["total_rss"] = p.peak["VmRSS"] - base["VmRSS"]
    return out


def run_phase(args, with_work: bool) -> dict:
    cmd = [sys.executable, __file__, "--phase", "work" if with_work else "open", "--dir", args.dir, "--rows", str(args.rows),
           "--dim", str(args.dim), "--lookups", str(args.lookups), "--queries", str(args.queries)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        sys.exit(f"phase failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument(
        "--shard-rows", type=int, default=1024, help="rows per shard (posfair embed's default --shard-size)"
    )
    ap.add_argument("--lookups", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument(
        "--dir", help="store folder (default: a temporary one, removed at the end); an existing store is reused"
    )
    ap.add_argument("--phase", choices=["open", "work"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.dir, args.rows, args.lookups, args.queries, args.dim, args.phase == "work")))
        return
    tmp = None
    if args.dir is None:
        tmp = args.dir = tempfile.mkdtemp(prefix="posfair-store-scale-")
    try:
        import posfair

        built = not any(os.scandir(args.dir)) if os.path.isdir(args.dir) else True
        print(f"posfair {posfair.__version__} from {os.path.dirname(posfair.__file__)}")
        if built:
            secs = build(args.dir, args.rows, args.dim, args.shard_rows)
            print(f"wrote {args.rows:,} x {args.dim} float32 in shards of {args.shard_rows:,}: {secs:.1f} s "
                  f"({args.rows / secs:,.0f} rows/s)")  # fmt: skip
        first = run_phase(args, with_work=False)
        warm = run_phase(args, with_work=True)
        scale = f"{args.rows:,} x {args.dim}"
        rows = [
            ("first open (s)", first["open_s"], "-", ""),
            ("first open RSS / anon (MB)", f"{first['open_rss']:.0f} / {first['open_anon']:.0f}", "-", ""),
            ("open (s)", warm["open_s"], "< 2 s", warm["open_s"] < 2),
            ("open RSS / anon (MB)", f"{warm['open_rss']:.0f} / {warm['open_anon']:.0f}", "< 200 MB", warm["open_rss"] < 200),
            (f"{args.lookups:,} lookups (s)", warm["lookup_s"], "< 1 s", warm["lookup_s"] < 1),
            (f"search {args.queries} queries, top-10 (s)", warm["search_s"], "-", ""),
            ("search peak RSS / anon growth (MB)", f"{warm['search_rss']:.0f} / {warm['search_anon']:.0f}", "anon < 200 MB",
             warm["search_anon"] < 200),
        ]  # fmt: skip
        print(f"\nstore of {scale} ({len_str(warm['len'])} keys)")
        print(f"{'measure':<40} {'value':>14}  {'target':<14} met")
        for name, value, target, ok in rows:
            v = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"{name:<40} {v:>14}  {target:<14} {'' if ok == '' else ('yes' if ok else 'NO')}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def len_str(n: int) -> str:
    return f"{n:,}"


if __name__ == "__main__":
    main()
