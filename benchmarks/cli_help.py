"""How long ``posfair --help`` and every ``posfair COMMAND --help`` take, against the 1 s target.

Each measurement is a fresh subprocess (interpreter start, imports, help text), as a
user's shell runs it; the median of ``--repeats`` runs is kept (one untimed warm-up
run first fills the OS file cache).  The commands import the heavy library (torch,
transformers, pandas, the pipelines) only when they run, so the help of every
command should stay well under a second.  Not a test: timings depend on the machine.

    python benchmarks/cli_help.py                 # 5 runs each
    python benchmarks/cli_help.py --repeats 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TARGET_S = 1.0
COMMANDS = ("encode", "embed", "audit", "demo", "attention", "retrieval", "sweep", "build-benchmark", "tune")


def wall_time(args: list[str]) -> float:
    """Seconds one ``python -m posfair.cli ARGS`` takes from start to exit (it must exit 0)."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "posfair.cli", *args], capture_output=True, text=True, env=os.environ)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"posfair {' '.join(args)} exited {res.returncode}:\n{res.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command line (median kept)")
    opts = parser.parse_args()
    wall_time(["--help"])  # warm-up: the file cache, .pyc files
    rows = []
    for cmd in (None, *COMMANDS):
        args = ["--help"] if cmd is None else [cmd, "--help"]
        times = [wall_time(args) for _ in range(opts.repeats)]
        rows.append((" ".join(["posfair", *args]), statistics.median(times), max(times)))
    width = max(len(r[0]) for r in rows)
    print(f"{'command':<{width}}  median   max    target {TARGET_S:.1f} s")
    for name, median, worst in rows:
        verdict = "ok" if median < TARGET_S else "SLOW"
        print(f"{name:<{width}}  {median:5.2f} s  {worst:5.2f} s  {verdict}")
    slow = [r[0] for r in rows if r[1] >= TARGET_S]
    print(
        f"{len(rows) - len(slow)} of {len(rows)} under {TARGET_S:.1f} s"
        + (f"; slow: {', '.join(slow)}" if slow else "")
    )


if __name__ == "__main__":
    main()
