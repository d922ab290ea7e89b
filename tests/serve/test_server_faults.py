"""``posfair serve`` when Ray fails under it, and when a service manager stops the whole process group.

Each test starts its own server (the command as a shell runs it, forked by tests/forked.py) on the seeded tiny BERT,
waits for it to serve, then breaks its Ray instance: the process must end by itself within a bounded time, with one
line saying why, never hang (issue 48, defects 5 and 6).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from forked import server
from ray_sessions import session_of, session_processes, session_settles, sessions

pytestmark = pytest.mark.timeout(300, method="thread")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tiny_model_path, tmp_path, *extra: str):
    """A served tiny model: (run, session folder, url)."""
    path, pooling = tiny_model_path("bert")
    port = free_port()
    before = sessions()
    args = ["serve", "--model", str(path), "--pooling", pooling, "--max-seq-length", "64", "--port", str(port), *extra]
    run = server().start(args, tmp_path)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while f"serving {path}" not in (run.out.read_text() if run.out.exists() else ""):
        err = run.err.read_text() if run.err.exists() else ""
        assert time.monotonic() < deadline and "error:" not in err, err[-2000:]
        time.sleep(0.05)
    return run, session_of(run.pid, before), url


def pids(session, kind: str) -> list[int]:
    return [int(line.split()[0]) for line in session_processes(session, (kind,))]


def test_a_killed_raylet_ends_the_server_with_one_line(tiny_model_path, tmp_path):
    """Defect 6: kill -9 of the raylet left a process that neither served nor exited (and ignored SIGTERM). Now the
    server notices Ray no longer answers and exits 1 within a minute, its last line one 'error:' naming Ray.
    (Before it, on the same server: a request over --request-timeout gets 408 in OpenAI's shape.)"""
    run, session, url = start(tiny_model_path, tmp_path, "--request-timeout", "0.1")
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        assert r.status == 200
    # --request-timeout: 2,048 texts go in 128 parts, each waiting 5 ms for its batch: far over 0.1 s
    body = json.dumps({"model": str(tiny_model_path("bert")[0]), "input": [f"text {i}" for i in range(2048)]})
    request = urllib.request.Request(url + "/v1/embeddings", body.encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as late:
        urllib.request.urlopen(request, timeout=60)
    error = json.loads(late.value.read())["error"]
    assert late.value.code == 408 and error["code"] == "request_timeout" and "--request-timeout" in error["message"]
    # a body dripping in (its head whole): 408 once --request-timeout is over, not a connection held while it drips
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=60) as s:
        s.sendall(head + body.encode()[:10])
        t0, answer = time.monotonic(), b""
        while chunk := s.recv(65536):
            answer += chunk
            if b'"code":"request_timeout"' in answer.replace(b" ", b""):
                break
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 30, answer[:300]
    (raylet,) = pids(session, "raylet/raylet")
    t0 = time.monotonic()
    os.kill(raylet, signal.SIGKILL)
    try:
        res = server().wait(run, timeout=90)
    except Exception:
        os.kill(run.pid, signal.SIGKILL)
        raise
    took = time.monotonic() - t0
    assert res.returncode == 1 and took < 75, (res.returncode, took, res.stderr[-2000:])
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Ray" in last, res.stderr[-2000:]
    session_settles(session, timeout=30)


def test_sigterm_to_the_whole_process_group_stops_cleanly(tiny_model_path, tmp_path):
    """Defect 5: SIGTERM to the server's process group (systemd's control-group mode) reached Ray's GCS and raylet
    first; posfair hung ~64 s and exited 1 without 'stopped'. Now: exit 0 and 'stopped' within the stop bound.

    Before it, on the same server: defect 7's burst of 16 requests right after 'serving' is printed all get 200
    (they got 503 "loading" while the gateway's first readiness query was in flight), a request over
    --max-request-tokens gets 413 and one over --request-timeout 408, in OpenAI's shape."""
    run, session, url = start(tiny_model_path, tmp_path, "--max-request-tokens", "100")

    def post(texts):
        body = json.dumps({"model": str(tiny_model_path("bert")[0]), "input": texts}).encode()
        req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    with ThreadPoolExecutor(16) as pool:
        burst = list(pool.map(post, [[f"text number {i}"] for i in range(16)]))
    assert [status for status, _ in burst] == [200] * 16, burst
    status, body = post(["word " * 30] * 4)  # 32 tokens each (30 words, CLS, SEP): 128
    assert status == 413 and body["error"]["code"] == "request_too_large", (status, body)
    assert "holds 128 tokens" in body["error"]["message"] and "--max-request-tokens" in body["error"]["message"], body
    status, body = post(["word " * 30] * 40)  # refused after its second part of 16
    assert status == 413 and "over " in body["error"]["message"], (status, body)
    assert post(["word " * 30] * 3)[0] == 200  # 96 tokens
    group = [int(line.split()[0]) for line in session_processes(session)]  # every process of the server
    assert run.pid in group and pids(session, "gcs_server") and pids(session, "raylet/raylet")
    t0 = time.monotonic()
    for pid in sorted(set(group) - {run.pid}) + [run.pid]:  # as kill -- -PGID delivers it: Ray's first, all at once
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    res = server().wait(run, timeout=90)
    took = time.monotonic() - t0
    assert res.returncode == 0 and res.stdout.rstrip().endswith("stopped"), (res.stdout, res.stderr[-2000:])
    assert took < 40, took
    assert not session_settles(session, timeout=30)
