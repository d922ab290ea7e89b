"""posfair.serve.proxy, the guard Ray Serve's HTTP proxy runs: on uvicorn as Serve runs it (h11, its keep-alive
timeout), in a process of its own, without Ray.  The real server (test_server.py) checks the same through Serve."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from posfair.serve.openai_api import key_digest
from posfair.serve.proxy import HEAD_TIMEOUT_S, MAX_HEAD_BYTES, MAX_HEADERS

pytestmark = pytest.mark.timeout(120, method="thread")

KEY = "proxy-key-7"
APP = f"""
import os, sys, uvicorn
os.environ["POSFAIR_SERVE_KEY_SHA256"] = {key_digest(KEY)!r}
from posfair.serve.proxy import guard

async def app(scope, receive, send):
    while (await receive())["more_body"] if scope["method"] == "POST" else False:
        pass
    body = ("answered " + scope["path"]).encode()
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}})
    await send({{"type": "http.response.body", "body": body}})

for m in reversed(guard()):
    app = m.cls(app, *m.args, **m.kwargs)
sock = __import__("socket").socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
server = uvicorn.Server(uvicorn.Config(app, timeout_keep_alive=5, lifespan="off", log_level="critical", http="h11"))
server.run(sockets=[sock])
"""


@pytest.fixture(scope="module")
def proxy():
    proc = subprocess.Popen([sys.executable, "-c", APP], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def exchange(port: int, raw: bytes, chunk: int = 4096, pause: float = 0.05, timeout: float = 60) -> tuple[bytes, float]:
    """(everything the server sent until it closed the connection, seconds from the first byte sent) for ``raw``
    sent ``chunk`` bytes at a time (``pause`` seconds apart), no more once the server has answered (so the answer
    is read before the server's close resets the connection)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        for start in range(0, len(raw), chunk):
            if select.select([s], [], [], pause)[0]:
                break
            try:
                s.sendall(raw[start : start + chunk])
            except OSError:
                break
        got = b""
        while data := s.recv(65536):
            got += data
    return got, time.monotonic() - t0


def status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)["error"]


def test_a_normal_request_passes_and_keep_alive_works(proxy):
    with socket.create_connection(("127.0.0.1", proxy), timeout=30) as s:
        for i in range(2):  # two requests on one connection: the head timer is re-armed and passes
            s.sendall(f"GET /v1/models?{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            got = b""
            while not got.endswith(b"answered /v1/models"):
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 200"), got


def test_too_many_or_too_large_headers_get_431_in_openai_shape(proxy):
    """Issue 48: 10,000 headers or a 1 MiB header were answered 200; now 431 in OpenAI's error shape, at once."""
    many = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS + 1))
    for raw in (
        f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode(),
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\n" + "".join(f"X-H{i}: v\r\n" for i in range(10_000)).encode() + b"\r\n",
    ):
        answer, _ = exchange(proxy, raw)
        status, err = status_and_error(answer)
        assert status == 431 and err["code"] == "request_header_fields_too_large", (status, err)
        assert set(err) == {"message", "type", "param", "code"}
    fits = "".join(f"X-H{i}: v\r\n" for i in range(MAX_HEADERS - 2))
    answer, _ = exchange(proxy, f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{fits}Connection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_slow_head_gets_408_and_a_silent_connection_is_closed(proxy):
    """Issue 48: connections dripping a header a byte a second were held open for a minute; now a head must arrive
    within HEAD_TIMEOUT_S: a partial one gets 408 in OpenAI's shape, a connection that sent nothing is closed."""
    with socket.create_connection(("127.0.0.1", proxy), timeout=60) as silent:
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        got, took = exchange(proxy, head, chunk=1, pause=0.5)  # a byte each 0.5 s: 54 s for the whole head
        status, err = status_and_error(got)
        assert status == 408 and err["code"] == "request_timeout", (status, err)
        assert HEAD_TIMEOUT_S - 1 < took < HEAD_TIMEOUT_S + 5, took
        assert silent.recv(65536) == b""  # closed, with nothing sent: it had sent nothing


def test_serves_own_paths_ask_the_key(proxy):
    """Issue 48: Serve's /-/routes answered without the key; now every /-/ path asks it (401 in OpenAI's shape)."""
    url = f"http://127.0.0.1:{proxy}"
    for path in ("/-/routes", "/-/healthz", "/-/anything"):
        for key in (None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=30)
            assert err.value.code == 401 and json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
        req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.read() == f"answered {path}".encode()
    with urllib.request.urlopen(url + "/health", timeout=30) as r:  # the gateway's own paths: the gateway asks
        assert r.status == 200
