"""Load on ``posfair serve``: throughput and latency at concurrency 1, 8 and 32 against ``encode`` in-process.

In one run, with the bundled MiniLM at a 512-token limit (or ``--model``), on texts of 16 to 512 tokens cut from
the bundled corpus (one text per request, as a search engine embeds its queries and documents one by one):

  in-process   posfair's encode_cached of all the texts (batch 32), model loaded, before the server starts
  server       ``posfair serve --request-calibration --calibration default`` on a local Ray instance, one replica;
               requests from C client threads at once (C = 1, 8, 32), each request one text, base64 vectors:
               throughput (texts/s) and p50 / p99 latency per request, stock and (at C=32) calibrated

  head of line one request of ``--big`` texts (2,048 by default, OpenAI's most) and, starting 1 s after it, small
               requests (one text each, one at a time) until it is answered: their p50 / p99 latency, against the
               same small requests on an idle server (the server sends a long request to its replica in parts of
               16 texts, a client's long requests taking turns, so small requests are batched between the parts
               instead of waiting for all of it)

and prints the ratios the issue targets: server at C=32 / in-process (stock; target >= 0.8 on 2 CPU cores) and
calibrated / stock through the server at C=32 (target <= 1.1 in time).  Every answer's vector is checked against
the in-process one (max abs diff <= 1e-5).

    python benchmarks/serve_load.py                   # 192 texts, a 2,048-text request: ~8 min on 2 idle cores
    python benchmarks/serve_load.py --texts 64 --big 256
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def sample_texts(model, n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 16 to 512 tokens (uniform), cut from the bundled corpus's sections."""
    from posfair.corpus import load_corpus

    words = " ".join(load_corpus().text.tolist()).split()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        target = int(rng.integers(16, 513))
        start = int(rng.integers(0, len(words) - 600))
        lo, hi = 1, 600
        while lo < hi:  # the most words whose tokens fit the target
            mid = (lo + hi + 1) // 2
            if model.token_lengths([" ".join(words[start : start + mid])])[0] <= target:
                lo = mid
            else:
                hi = mid - 1
        out.append(" ".join(words[start : start + lo]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict) -> tuple[float, np.ndarray]:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        body = json.loads(r.read())
    dt = time.perf_counter() - t0
    return dt, np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")


def load(url: str, name: str, texts: list[str], concurrency: int, **fields) -> tuple[float, list[float], np.ndarray]:
    """(wall seconds, latencies, vectors) of one request per text from ``concurrency`` threads."""
    payloads = [{"model": name, "input": t, "encoding_format": "base64", **fields} for t in texts]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda p: post(url + "/v1/embeddings", p), payloads))
    wall = time.perf_counter() - t0
    return wall, [a[0] for a in answers], np.stack([a[1] for a in answers])


def head_of_line(url: str, name: str, texts: list[str], big: int) -> tuple[list[float], list[float], float]:
    """(small-request latencies on the idle server, the same while one request of ``big`` texts runs, its seconds)."""
    import threading

    small = {"model": name, "input": "a short query about positional bias", "encoding_format": "base64"}
    idle = [post(url + "/v1/embeddings", small)[0] for _ in range(16)]
    payload = {"model": name, "input": [texts[i % len(texts)] for i in range(big)], "encoding_format": "base64"}
    box: dict = {}

    def send_big() -> None:
        req = urllib.request.Request(
            url + "/v1/embeddings", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as r:
            body = json.loads(r.read())
        box["seconds"], box["n"] = time.perf_counter() - t0, len(body["data"])

    sender = threading.Thread(target=send_big)
    sender.start()
    time.sleep(1.0)
    during = []
    while sender.is_alive():
        during.append(post(url + "/v1/embeddings", small)[0])
    sender.join()
    assert box.get("n") == big, box
    return idle, during, box["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--max-seq-length", type=int, default=512)
    ap.add_argument("--texts", type=int, default=192, help="texts per measured load (C=1 runs a third of them)")
    ap.add_argument("--max-batch-tokens", type=int, default=None, help="the server's --max-batch-tokens (its default)")
    ap.add_argument(
        "--big", type=int, default=2048, help="texts of the long request of the head-of-line load (0: none)"
    )
    args = ap.parse_args()

    import posfair
    from posfair import Calibration
    from posfair.calibration import STOCK
    from posfair.encoding import encode_cached

    model = posfair.load_model(None if args.model == "bundled" else args.model, max_seq_length=args.max_seq_length)
    texts = sample_texts(model, args.texts)
    lengths = model.token_lengths(texts)
    print(f"{len(texts)} texts, {lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.0f}); "
          f"{os.cpu_count()} CPU cores; model {args.model} at {args.max_seq_length} tokens")  # fmt: skip
    encode_cached(model, texts[:8], calibration=STOCK)  # warm-up
    t0 = time.perf_counter()
    ref = encode_cached(model, texts, calibration=STOCK, batch_size=32)
    inproc = time.perf_counter() - t0
    ref_cal = encode_cached(model, texts, calibration=Calibration(), batch_size=32)
    print(f"in-process encode_cached (stock, batch 32): {len(texts) / inproc:.1f} texts/s ({inproc:.1f} s)")
    del model

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    posfair_cmd = [str(Path(sys.executable).with_name("posfair"))]
    cmd = [*posfair_cmd, "serve", "--model", args.model, "--max-seq-length", str(args.max_seq_length), "--port",
           str(port), "--calibration", "default", "--request-calibration"]  # fmt: skip
    if args.max_batch_tokens:
        cmd += ["--max-batch-tokens", str(args.max_batch_tokens)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        while "serving" not in Path(log.name).read_text():
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit(f"the server did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.5)
        print(f"server ready in {time.perf_counter() - t0:.1f} s: {' '.join(cmd[1:])}")
        load(url, args.model, texts[:8], 8, calibration="stock")  # warm-up
        rows = {}
        for c in (1, 8, 32):
            part = texts[: max(8, len(texts) // 3)] if c == 1 else texts
            wall, lat, vecs = load(url, args.model, part, c, calibration="stock")
            diff = float(np.abs(vecs - ref[: len(part)]).max())
            rows[c] = (len(part) / wall, np.percentile(lat, 50), np.percentile(lat, 99), diff)
        wall_cal, lat_cal, vecs_cal = load(url, args.model, texts, 32)
        diff_cal = float(np.abs(vecs_cal - ref_cal).max())
        hol = head_of_line(url, args.model, texts, args.big) if args.big else None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    print(f"{'load':<24}{'texts/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'max|diff|':>11}")
    for c, (tps, p50, p99, diff) in rows.items():
        print(f"{'server stock, C=' + str(c):<24}{tps:9.1f}{p50 * 1e3:9.0f}{p99 * 1e3:9.0f}{diff:11.1e}")
    cal_tps = len(texts) / wall_cal
    print(f"{'server default cal, C=32':<24}{cal_tps:9.1f}{np.percentile(lat_cal, 50) * 1e3:9.0f}"
          f"{np.percentile(lat_cal, 99) * 1e3:9.0f}{diff_cal:11.1e}")  # fmt: skip
    ratio = rows[32][0] / (len(texts) / inproc)
    slow = rows[32][0] / cal_tps
    print(f"server C=32 / in-process: {ratio:.2f}x (target >= 0.8)  {'met' if ratio >= 0.8 else 'NOT MET'}")
    print(f"calibrated / stock time through the server, C=32: {slow:.2f}x (target <= 1.1)  "
          f"{'met' if slow <= 1.1 else 'NOT MET'}")  # fmt: skip
    if hol is not None:
        idle, during, big_s = hol
        print(f"head of line: one request of {args.big} texts took {big_s:.1f} s; meanwhile {len(during)} small "
              f"requests: p50 {np.percentile(during, 50) * 1e3:.0f} ms, p99 {np.percentile(during, 99) * 1e3:.0f} ms, "
              f"max {max(during) * 1e3:.0f} ms (idle server: p50 {np.percentile(idle, 50) * 1e3:.0f} ms, "
              f"p99 {np.percentile(idle, 99) * 1e3:.0f} ms)")  # fmt: skip
    worst = max([r[3] for r in rows.values()] + [diff_cal])
    print(f"vectors: max abs diff to in-process {worst:.1e} ({'ok' if worst <= 1e-5 else 'OVER 1e-5'})")


if __name__ == "__main__":
    main()
