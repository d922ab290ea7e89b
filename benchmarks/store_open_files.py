"""The embedding store under a low open-file limit: 100,000 small shards, ``ulimit -n 256`` (issue 38, item 2).

Builds a namespace of ``--shards`` shards of ``--rows`` keys x ``--dim`` float32 each in a
temporary folder (or ``--dir``), written with posfair's shard writer (``write_shard``; the
temporary files are not flushed to disk, which only the build's speed notices), then, each
in a process started by ``bash -c 'ulimit -n LIMIT && exec ...'``:

  posfair verify   the command line, ``posfair verify STORE`` (every shard read and checked
                   against its checksum; the key index built): its exit code and last line
  verify_store     the library's full check again, then, in the same process:
  open             ``EmbeddingStore(root).namespace(...)`` (the index trusts every shard)
  every shard      ``ns.get`` of one key of every shard, in random order (every shard mapped
                   once; the set keeps at most ``MAPPED_SHARDS`` mapped)
  random keys      ``ns.get`` of ``--lookups`` random keys
  stream           ``ns.chunks()``: every shard's vectors, summed

and prints the counts (shards, rows, shards set aside -- which must be 0 --, the highest
number of open file descriptors seen, sampled every millisecond, and shard files still
mapped at the end of each phase) and the times.  Every vector read is compared with the one
written (``10 g + [0, 0.25, ...]`` for the g-th key).  Not a timed test: the numbers are
printed, not asserted, but the run exits 1 when a shard was set aside or a vector differs.

    python benchmarks/store_open_files.py                  # 100,000 shards, ulimit -n 256
    python benchmarks/store_open_files.py --shards 2000    # quicker
    PYTHONPATH=/path/to/old/src python benchmarks/store_open_files.py --shards 2000   # another posfair
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

META = {"model": "store-open-files-benchmark"}


def key(g: int) -> str:
    return f"key-{g:09d}"


def vectors(g: np.ndarray, dim: int) -> np.ndarray:
    """The vector of the g-th key (exact in float32 below 2**22 keys)."""
    return (10.0 * np.asarray(g, dtype=np.float64)[:, None] + 0.25 * np.arange(dim)).astype(np.float32)


def _write(job: tuple[str, int, int, int, int]) -> None:
    """Write shards ``lo`` .. ``hi - 1`` (one worker of the build)."""
    import posfair.store.shards as shards
    from posfair.store import run_settings, write_shard

    @contextlib.contextmanager
    def unflushed(path):  # the benchmark's own throw-away store: a rename, no fsync (the build's speed only)
        tmp = Path(f"{path}.tmp")
        yield tmp
        os.replace(tmp, path)

    shards.atomic_path = unflushed
    ns_dir, lo, hi, rows, dim = job
    settings = run_settings(META)
    for s in range(lo, hi):
        g = np.arange(s * rows, (s + 1) * rows)
        write_shard(ns_dir, [key(int(i)) for i in g], vectors(g, dim), name=f"{s:07d}", settings=settings)


def build(root: str, shards: int, rows: int, dim: int, jobs: int) -> float:
    from posfair.store import EmbeddingStore, run_settings, write_manifest

    ns_dir = EmbeddingStore(root).namespace_dir(**META)
    write_manifest(ns_dir, {**run_settings(META), "dim": dim})
    t0 = time.perf_counter()
    step = max(1, shards // (jobs * 20))
    work = [(str(ns_dir), lo, min(shards, lo + step), rows, dim) for lo in range(0, shards, step)]
    with Pool(jobs) as pool:
        for _ in pool.imap_unordered(_write, work):
            pass
    return time.perf_counter() - t0


class PeakFds:
    """Samples this process's open file descriptors every millisecond in a thread; ``peak`` is the highest count."""

    def __enter__(self):
        self.peak = self.count()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    @staticmethod
    def count() -> int:
        return len(os.listdir("/proc/self/fd"))

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.count())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.count())


def mapped_shards() -> int:
    """Shard files this process has memory-mapped now."""
    with open("/proc/self/maps") as fh:
        return len({line.split()[-1] for line in fh if "/part-" in line and line.rstrip().endswith(".arrow")})


def child(root: str, shards: int, rows: int, dim: int, lookups: int) -> dict:
    """The measured process (run under the open-file limit)."""
    import resource

    from posfair.store import EmbeddingStore, verify_store

    out: dict = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "fds_at_start": PeakFds.count(), "phases": []}
    bad = 0

    def phase(name: str, fn):
        with PeakFds() as p:
            t0 = time.perf_counter()
            result = fn()
            secs = time.perf_counter() - t0
        out["phases"].append({"phase": name, "s": secs, "peak_fds": p.peak, "mapped_after": mapped_shards()})
        return result

    (rec,) = phase("verify_store", lambda: verify_store(root))
    out["verify_store"] = {k: rec[k] for k in ("shards", "rows", "keys", "error")} | {"damaged": len(rec["damaged"])}
    ns = phase("open", lambda: EmbeddingStore(root).namespace(**META))
    rng = np.random.default_rng(0)
    one_each = rng.permutation(shards) * rows + rng.integers(0, rows, shards)
    got = phase(f"every shard ({shards:,} keys)", lambda: ns.get([key(int(g)) for g in one_each]))
    bad += int((got != vectors(one_each, dim)).any(axis=1).sum())
    picks = rng.integers(0, shards * rows, lookups)
    got = phase(f"random keys ({lookups:,})", lambda: ns.get([key(int(g)) for g in picks]))
    bad += int((got != vectors(picks, dim)).any(axis=1).sum())
    total = phase("stream", lambda: sum(float(c.sum(dtype=np.float64)) for c in ns.chunks()))
    g = np.arange(shards * rows, dtype=np.float64)
    out["stream_ok"] = bool(np.isclose(total, 10.0 * g.sum() * dim + len(g) * 0.25 * dim * (dim - 1) / 2, rtol=1e-9))
    out["wrong_vectors"] = bad
    return out


def limited(limit: int, argv: list[str]) -> list[str]:
    """``argv`` run by a shell after ``ulimit -n LIMIT`` (as a user would)."""
    return ["bash", "-c", f'ulimit -n {limit} && exec "$@"', "bash", *argv]


def set_aside(root: str) -> int:
    return sum(1 for _ in Path(root).rglob("*.damaged-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=4, help="keys per shard")
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--limit", type=int, default=256, help="the open-file limit (ulimit -n) of the measured processes")
    ap.add_argument("--lookups", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing the shards")
    ap.add_argument("--dir", help="store folder (default: a temporary one, removed at the end); a built one is reused")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.dir, args.shards, args.rows, args.dim, args.lookups)))
        return
    tmp = None
    if args.dir is None:
        tmp = args.dir = tempfile.mkdtemp(prefix="posfair-open-files-")
    try:
        import posfair

        print(f"posfair {posfair.__version__} from {os.path.dirname(posfair.__file__)}")
        if not any(Path(args.dir).glob("*/part-*.arrow")):
            secs = build(args.dir, args.shards, args.rows, args.dim, args.jobs)
            print(
                f"wrote {args.shards:,} shards of {args.rows} x {args.dim} float32: {secs:.1f} s ({args.jobs} processes)"
            )
        cli = [sys.executable, "-m", "posfair.cli", "verify", args.dir]
        t0 = time.perf_counter()
        res = subprocess.run(limited(args.limit, cli), capture_output=True, text=True, check=False)
        cli_s = time.perf_counter() - t0
        last = (res.stdout.strip().splitlines() or [""])[-1]
        errors = [line for line in res.stderr.splitlines() if line.startswith(("error:", "warning:"))]
        print(f"\nposfair verify under ulimit -n {args.limit}: exit {res.returncode}, {cli_s:.1f} s: {last}")
        for line in errors[:5]:
            print(f"  {line}")
        if len(errors) > 5:
            print(f"  ... {len(errors) - 5} more error/warning lines")
        aside_cli = set_aside(args.dir)
        cmd = [sys.executable, __file__, "--child", "--dir", args.dir, "--shards", str(args.shards),
               "--rows", str(args.rows), "--dim", str(args.dim), "--lookups", str(args.lookups)]  # fmt: skip
        res = subprocess.run(limited(args.limit, cmd), capture_output=True, text=True, check=False)
        if res.returncode:
            print(f"the library run under ulimit -n {args.limit} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
            sys.exit(1)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        v = out["verify_store"]
        print(f"\nlibrary under ulimit -n {out['limit']} ({out['fds_at_start']} files open at start)")
        print(
            f"  shards {v['shards']:,} of {args.shards:,}, rows {v['rows']:,}, keys {v['keys']:,}, error {v['error']}"
        )
        print(
            f"  set aside: {aside_cli} by posfair verify, {v['damaged']} by verify_store (total now {set_aside(args.dir)})"
        )
        print(f"  vectors differing from those written: {out['wrong_vectors']}; stream sum right: {out['stream_ok']}")
        print(f"\n  {'phase':<28}{'seconds':>9}{'peak open fds':>15}{'shards mapped after':>21}")
        for p in out["phases"]:
            print(f"  {p['phase']:<28}{p['s']:>9.2f}{p['peak_fds']:>15}{p['mapped_after']:>21}")
        if set_aside(args.dir) or out["wrong_vectors"] or not out["stream_ok"] or v["shards"] != args.shards:
            sys.exit(1)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
