"""Soak of ``posfair serve`` before a release: steady load for minutes, the model replica killed now and then.

It starts ``posfair serve`` (the bundled MiniLM, or ``--model``) on a free port of the loopback as a subprocess,
then runs ``--clients`` client threads (8) for ``--minutes`` (10), each sending one request after another of 1 to
``--max-texts`` (64) texts of up to ``--max-chars`` (~1,000) characters, drawn from a pool cut from the bundled
corpus (every one within the model's token limit, so no request is refused).  Requests of over 16 texts reach the
replica in parts, through its second request queue, so the replica's two queues and their threads run at once.

Every ``--kill-every`` seconds (150; 0: never) it kills the encoder replica (SIGKILL of the ``ServeReplica``
process of the ``PosfairEncoder`` deployment, found among the server's own descendant processes; Linux only): Serve
starts another, and meanwhile the gateway answers 503 (expected; a client then waits 0.5 s).

It counts the answers by status (200 / 503 / 500 / other, a connection error among the others), checks every 200's
vectors against posfair's in-process ``encode_cached`` of the same texts (max abs diff within 1e-5), and prints a
table; each 500 and wrong answer is listed with its size and the seconds since the last kill, and the replica's
log lines about it (the server's Ray session logs).  It exits 1 when any answer was a 500, other than 200 or 503,
or a 200 with a wrong vector; else 0.

    python benchmarks/serve_soak.py                              # 10 minutes, 8 clients, a kill every 150 s
    python benchmarks/serve_soak.py --minutes 2 --kill-every 40  # a short one
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from serve_load import free_port, sample_texts

#: the deployment of the model replicas (posfair.serve.deployments.ENCODER), in its replica's process title
ENCODER = "PosfairEncoder"
TOLERANCE = 1e-5


@dataclass
class Result:
    sent: float  # seconds since the soak began
    seconds: float
    texts: int
    status: int | str  # the HTTP status, or the connection error's type
    diff: float = 0.0  # a 200's max abs difference to the in-process vectors (inf: wrong shape)


class ArgError(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


def parse_args() -> argparse.Namespace:
    ap = ArgError(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bundled", help="the model served and encoded in-process (bundled)")
    ap.add_argument("--clients", type=int, default=8, help="client threads sending at once (8)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the clients send (10)")
    ap.add_argument("--kill-every", type=float, default=150.0, help="seconds between replica kills (150; 0: none)")
    ap.add_argument("--max-texts", type=int, default=64, help="texts per request, at most (64)")
    ap.add_argument("--max-chars", type=int, default=1000, help="characters per text, about at most (1000)")
    ap.add_argument("--pool", type=int, default=256, help="distinct texts the requests are drawn from (256)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    checks = [
        ("--clients", args.clients, args.clients >= 1, "at least 1"),
        ("--minutes", args.minutes, 0 < args.minutes <= 24 * 60, "over 0 and at most 1440"),
        ("--kill-every", args.kill_every, args.kill_every == 0 or args.kill_every >= 10, "0 (no kills) or >= 10"),
        ("--max-texts", args.max_texts, 1 <= args.max_texts <= 2048, "from 1 to 2048 (OpenAI's most)"),
        ("--max-chars", args.max_chars, args.max_chars >= 20, "at least 20"),
        ("--pool", args.pool, args.pool >= args.max_texts, f"at least --max-texts ({args.max_texts})"),
    ]
    for name, value, ok, must in checks:
        if not ok:
            ap.error(f"{name} must be {must}; got {value}")
    return args


def text_pool(model, n: int, max_chars: int, seed: int) -> list[str]:
    """``n`` texts of the bundled corpus (serve_load's sample), each cut at a word to at most ``max_chars``
    characters, all within the model's token limit."""
    out: list[str] = []
    while len(out) < n:
        for text in sample_texts(model, n, seed=seed + len(out)):
            cut = text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0]
            if cut and model.token_lengths([cut])[0] <= model.max_seq_length and len(out) < n:
                out.append(cut)
    return out


def descendants(root: int) -> list[int]:
    """The processes under ``root`` (Linux /proc), children first."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [root]
    while todo:
        above = todo.pop()
        kids = [p for p, pp in parent.items() if pp == above]
        found += kids
        todo += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_replicas(server: int) -> list[int]:
    """SIGKILL of the server's encoder replicas (its own descendants only); their process ids."""
    pids = [p for p in descendants(server) if "ServeReplica" in cmdline(p) and ENCODER in cmdline(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def session_dir(server: int) -> Path | None:
    """The Ray session folder of the server's own Ray instance (its raylet's --session_dir)."""
    for pid in descendants(server):
        for arg in cmdline(pid).split():
            if arg.startswith("--session_dir="):
                return Path(arg.split("=", 1)[1])
    return None


def send(url: str, name: str, texts: list[str]) -> tuple[int | str, np.ndarray | None]:
    payload = json.dumps({"model": name, "input": texts, "encoding_format": "base64"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", payload, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            data = json.loads(r.read())["data"]
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, None
    except (OSError, ValueError) as e:  # a connection refused, reset or timed out; an unreadable answer
        return type(e).__name__, None
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    return 200, np.stack(vectors) if vectors else np.zeros((0, 0), np.float32)


@dataclass
class Load:
    url: str
    name: str  # the served model's name
    pool: list[str]
    ref: np.ndarray  # the pool's vectors, encoded in-process
    t0: float  # the soak's start (time.monotonic)
    until: float


def client(load: Load, args, k: int, out: list[Result]) -> None:
    """One client's requests until the soak ends, one after another."""
    rng = np.random.default_rng(args.seed * 1000 + k)
    while time.monotonic() < load.until:
        idx = rng.choice(len(load.pool), size=int(rng.integers(1, args.max_texts + 1)), replace=False)
        sent = time.monotonic()
        status, vectors = send(load.url, load.name, [load.pool[i] for i in idx])
        res = Result(sent - load.t0, time.monotonic() - sent, len(idx), status)
        if status == 200:
            want = load.ref[idx]
            res.diff = float(np.abs(vectors - want).max()) if vectors.shape == want.shape else float("inf")
        out.append(res)
        if status != 200:
            time.sleep(0.5)


def start_server(cmd: list[str], log: Path) -> subprocess.Popen:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    while "serving" not in log.read_text():
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            proc.kill()
            raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    print(f"server ready in {time.monotonic() - t0:.1f} s: {' '.join(cmd[1:])}", flush=True)
    return proc


def soak(url: str, args, pool: list[str], ref: np.ndarray, proc: subprocess.Popen) -> tuple[list[Result], list]:
    """The clients' results and the kills (seconds since the start, process ids killed)."""
    results: list[Result] = []
    kills: list[tuple[float, list[int]]] = []
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    load = Load(url, args.model, pool, ref, t0, until)
    threads = [threading.Thread(target=client, args=(load, args, k, results), daemon=True) for k in range(args.clients)]
    for t in threads:
        t.start()
    next_kill = t0 + args.kill_every if args.kill_every else float("inf")
    while time.monotonic() < until:
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        if time.monotonic() >= next_kill and time.monotonic() < until - 5:
            pids = kill_replicas(proc.pid)
            kills.append((time.monotonic() - t0, pids))
            print(f"  {kills[-1][0]:6.0f} s: killed the encoder replica (pid {pids or 'none found'})", flush=True)
            next_kill += args.kill_every
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) during the soak")
    for t in threads:
        t.join(330)
    return results, kills


def since_kill(t: float, kills: list[tuple[float, list]]) -> str:
    before = [k for k, _ in kills if k <= t]
    return f"{t - before[-1]:.0f} s after a kill" if before else "before any kill"


def report(results: list[Result], kills: list[tuple[float, list]], args, logs: Path | None) -> int:
    """Prints the table and the failures; the exit status."""
    kind = Counter(r.status if r.status in (200, 503, 500) else "other" for r in results)
    wrong = [r for r in results if r.status == 200 and r.diff > TOLERANCE]
    print(f"\n{'answer':<18}{'requests':>9}{'texts':>8}{'p50 ms':>9}{'p99 ms':>9}")
    for label in (200, 503, 500, "other"):
        rs = [r for r in results if (r.status if r.status in (200, 503, 500) else "other") == label]
        lat = [r.seconds * 1e3 for r in rs] or [float("nan")]
        print(f"{label!s:<18}{len(rs):9d}{sum(r.texts for r in rs):8d}"
              f"{np.percentile(lat, 50):9.0f}{np.percentile(lat, 99):9.0f}")  # fmt: skip
    worst = max((r.diff for r in results if r.status == 200), default=float("nan"))
    print(f"{args.clients} clients, {args.minutes:g} min, {len(kills)} replica kills; 200s' vectors: max abs diff "
          f"{worst:.1e} to in-process, {len(wrong)} over {TOLERANCE:g}")  # fmt: skip
    bad = [r for r in results if r.status not in (200, 503)] + wrong
    for r in sorted(bad, key=lambda r: r.sent):
        what = f"wrong vector (max abs diff {r.diff:.1e})" if r.status == 200 else f"status {r.status}"
        print(f"  {what}: {r.texts} texts, sent at {r.sent:.0f} s, {since_kill(r.sent, kills)}")
    if bad and logs is not None:
        lines = [
            f"{path.name}: {line}"
            for path in sorted((logs / "logs").rglob("*"))
            if path.is_file() and path.suffix in (".log", ".err", ".out")
            for line in path.read_text(errors="replace").splitlines()
            if "failed in the model replica" in line
        ]
        print(f"the replica's log ({logs / 'logs'}): {len(lines)} failure lines", *lines[:20], sep="\n  ")
    if not kind[200]:
        print("no request was answered 200")
    return 1 if bad or not kind[200] else 0


def main() -> None:
    args = parse_args()
    import posfair
    from posfair.calibration import STOCK
    from posfair.encoding import encode_cached

    model = posfair.load_model(None if args.model == "bundled" else args.model)
    pool = text_pool(model, args.pool, args.max_chars, args.seed)
    chars = [len(t) for t in pool]
    print(f"{len(pool)} texts of {min(chars)}-{max(chars)} characters "
          f"({model.token_lengths(pool).max()} tokens at most; limit {model.max_seq_length}); "
          f"{os.cpu_count()} CPU cores", flush=True)  # fmt: skip
    ref = encode_cached(model, pool, calibration=STOCK, batch_size=32)
    del model
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("posfair")), "serve", "--model", args.model, "--port", str(port)]
    log = Path(tempfile.mkdtemp(prefix="posfair-soak-")) / "server.log"
    proc = start_server(cmd, log)
    try:
        logs = session_dir(proc.pid)
        results, kills = soak(f"http://127.0.0.1:{port}", args, pool, ref, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    raise SystemExit(report(results, kills, args, logs))


if __name__ == "__main__":
    main()
