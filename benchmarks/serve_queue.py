"""Deep queues on ``posfair serve``: C concurrent one-text requests, what the gateway's bound (``--max-queued-requests``)
does to them.

For each C in ``--concurrency`` (default 100, 400), C client threads send one request each at once (one short text,
the bundled MiniLM by default) and this prints: answers by status (200, 503), throughput of the 200s (requests/s
over the wall time), p50 / max latency of the 200s and max latency of the 503s (refused at once: no queue), and
whether every 503 carried ``Retry-After``.  Run it once with the default bound (128 per replica) and once with a
large one (``--max-queued-requests 1000``) to compare a bounded queue with one holding everything.

    python benchmarks/serve_queue.py                                 # the default bound, C = 100, 400
    python benchmarks/serve_queue.py --max-queued-requests 1000 --concurrency 100 400 1000
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: bytes, start: threading.Event) -> tuple[int, float, bool]:
    """(status, seconds, Retry-After present) of one request, sent once ``start`` is set."""
    req = urllib.request.Request(url, payload, {"Content-Type": "application/json"})
    start.wait()
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=900) as r:
            r.read()
            return r.status, time.perf_counter() - t0, False
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, time.perf_counter() - t0, e.headers.get("Retry-After") is not None
    except OSError:
        return -1, time.perf_counter() - t0, False


def burst(url: str, name: str, concurrency: int) -> None:
    payloads = [json.dumps({"model": name, "input": f"query number {i}: positional bias"}).encode()
                for i in range(concurrency)]  # fmt: skip
    start, results = threading.Event(), [None] * concurrency

    def one(i: int) -> None:
        results[i] = post(url + "/v1/embeddings", payloads[i], start)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [dt for status, dt, _ in results if status == 200]
    refused = [(dt, retry) for status, dt, retry in results if status == 503]
    other = sorted({status for status, _, _ in results} - {200, 503})
    line = f"C={concurrency}: {len(ok)} x 200 ({len(ok) / wall:.1f} requests/s over {wall:.1f} s"
    if ok:
        line += f", p50 {np.percentile(ok, 50):.2f} s, max {max(ok):.2f} s"
    line += f"), {len(refused)} x 503"
    if refused:
        line += f" (max {max(dt for dt, _ in refused):.2f} s, Retry-After on {sum(r for _, r in refused)})"
    print(line + (f", other statuses {other}" if other else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--max-queued-requests", type=int, default=None, help="the server's bound (its default)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[100, 400])
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(Path(sys.executable).with_name("posfair")), "serve", "--model", args.model, "--port", str(port)]
    if args.max_queued_requests:
        cmd += ["--max-queued-requests", str(args.max_queued_requests)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    t0 = time.perf_counter()
    try:
        while "serving" not in Path(log.name).read_text():
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit(f"the server did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.5)
        print(f"server: {' '.join(cmd[1:])}", flush=True)
        burst(url, args.model, 8)  # warm-up
        for c in args.concurrency:
            burst(url, args.model, c)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


if __name__ == "__main__":
    main()
