"""posfair.serve.proxy, the guard Ray Serve's HTTP proxy runs: on uvicorn as Serve runs it (its keep-alive timeout),
in a process of its own, without Ray, on each of uvicorn's HTTP/1.1 implementations: httptools, what Serve's proxy
runs where it is installed (uvicorn's "auto"; Serve passes no ``http=``), and h11, what it runs where not.  The real
server (test_server.py) checks the same through Serve."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from tests import parent_bound

from posfair.serve.openai_api import key_digest
from posfair.serve.proxy import MAX_HEAD_BYTES, MAX_HEADERS

pytestmark = pytest.mark.timeout(120, method="thread")

#: the head timeout of the proxy under test (shorter than HEAD_TIMEOUT_S: the slow tests take seconds, not tens)
TIMEOUT_S = 3.0
#: how long the app takes to answer /slow: past the head timeout
SLOW_S = TIMEOUT_S + 2
IMPLEMENTATIONS = ["httptools", "h11"]

KEY = "proxy-key-7"
APP = f"""
import asyncio, os, sys, uvicorn
os.environ["POSFAIR_SERVE_KEY_SHA256"] = {key_digest(KEY)!r}
import posfair.serve.proxy as proxy
proxy.HEAD_TIMEOUT_S = {TIMEOUT_S!r}
from posfair.serve.proxy import guard

async def app(scope, receive, send):
    while (await receive())["more_body"] if scope["method"] == "POST" else False:
        pass
    if scope["path"] == "/slow":
        await asyncio.sleep({SLOW_S!r})
    body = ("answered " + scope["path"]).encode()
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}})
    await send({{"type": "http.response.body", "body": body}})

for m in reversed(guard()):
    app = m.cls(app, *m.args, **m.kwargs)
sock = __import__("socket").socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
server = uvicorn.Server(uvicorn.Config(app, timeout_keep_alive=5, lifespan="off", log_level="critical", http=sys.argv[1]))
server.run(sockets=[sock])
"""


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def proxy(request):
    if request.param == "httptools":
        pytest.importorskip("httptools")
    argv = parent_bound.command([sys.executable, "-c", APP, request.param], signal.SIGTERM)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
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


def head_of(headers: int, size: int = 0, method: str = "GET", eol: str = "\r\n") -> bytes:
    """A request head of exactly ``headers`` header lines (Host, Connection: close and X-H lines; at least 2) and,
    ``size`` given, exactly ``size`` bytes, its closing blank line included (the last header's value padded);
    lines ended by ``eol``."""
    lines = [f"{method} /v1/models HTTP/1.1", "Host: x", "Connection: close"]
    lines += [f"X-H{i}: v" for i in range(headers - 2)]
    lines[-1] += "v" * max(0, size - len(eol.join(lines) + eol * 2))
    raw = (eol.join(lines) + eol * 2).encode()
    assert raw.count(eol.encode()) == headers + 2 and (not size or len(raw) == size), (headers, size, len(raw))
    return raw


def sent_in(port: int, parts: list[bytes]) -> bytes:
    """What the server answered on one connection to ``parts`` sent one after another, 0.2 s apart (so that each
    arrives in a read of its own), until it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        for part in parts:
            try:
                s.sendall(part)
            except OSError:  # refused and closed
                break
            time.sleep(0.2)
        got = b""
        try:
            while data := s.recv(65536):
                got += data
        except ConnectionResetError:
            pass
    return got


def splits(raw: bytes) -> list[list[bytes]]:
    """``raw`` whole, and in two parts cut at each of the last four bytes (inside and before its blank line)."""
    return [[raw]] + [[raw[:cut], raw[cut:]] for cut in range(len(raw) - 4, len(raw))]


@pytest.mark.parametrize(
    ("headers", "size", "status"),
    [
        (MAX_HEADERS, 0, 200),
        (MAX_HEADERS + 1, 0, 431),
        (3, MAX_HEAD_BYTES, 200),
        (3, MAX_HEAD_BYTES + 1, 431),
    ],
    ids=["100-lines", "101-lines", "16384-bytes", "16385-bytes"],
)
def test_the_head_limits_hold_at_exactly_the_limit_however_the_head_is_split(proxy, headers, size, status):
    """Exactly MAX_HEADERS header lines (the request line and the blank line not counted) and exactly MAX_HEAD_BYTES
    bytes (the blank line included) are answered; one more line or byte is 431, whether the head arrives whole or
    cut inside its blank line.  (Before, a head of 100 header lines cut before its blank line was refused: the
    request line's and the last header's CRLFs were both counted, as a head of exactly the byte limit cut after
    its last header's CRLF; a mutation of either comparison or count by one fails here.)"""
    raw = head_of(headers, size)
    for parts in splits(raw):
        got = sent_in(proxy, parts)
        assert int(got.split()[1]) == status, ([len(p) for p in parts], got[:300])
        if status == 431:
            assert status_and_error(got)[1]["code"] == "request_header_fields_too_large"
        else:
            assert got.endswith(b"answered /v1/models"), got[-300:]


@pytest.mark.parametrize(
    ("headers", "size", "status"),
    [(MAX_HEADERS, 0, 200), (MAX_HEADERS + 1, 0, 431), (3, MAX_HEAD_BYTES, 200), (3, MAX_HEAD_BYTES + 1, 431)],
    ids=["100-lines", "101-lines", "16384-bytes", "16385-bytes"],
)
def test_a_pipelined_head_is_held_to_exactly_the_limits(proxy, headers, size, status):
    """A head sent in the same write as the request before it (the parser has it at once: httptools checks it when
    its headers are complete, h11's unparsed bytes are checked when the first answer is complete) holds to the same
    limits as a first head: exactly the limit answered, one over 431."""
    first = b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n"
    got = pipelined(proxy, first, head_of(headers, size), 0)
    if status == 200:
        assert got == [(200, b"answered /fast"), (200, b"answered /v1/models")], got
    else:
        assert got and got[-1][0] == 431 and got[:-1] in ([], [(200, b"answered /fast")]), got
        assert json.loads(got[-1][1])["error"]["code"] == "request_header_fields_too_large"


def test_header_lines_ended_by_a_bare_lf_are_counted(proxy, request):
    """h11 takes lines ended by a bare LF (no CR): such a head of more than MAX_HEADERS header lines is 431, one of
    exactly MAX_HEADERS answered, and the body of such a head is no part of it.  (Before, only CRLFs were counted:
    h11 answered 300 header lines 200, and a POST of such a head with a 20 KiB body was refused 431 for the body.)
    httptools refuses a bare LF itself (400) once it parses it; sent whole, the head's limits are checked first."""
    implementation = request.node.callspec.params["proxy"]
    over = head_of(MAX_HEADERS + 1, eol="\n")
    for parts in splits(over) if implementation == "h11" else [[over]]:
        got = sent_in(proxy, parts)
        assert status_and_error(got)[0] == 431, ([len(p) for p in parts], got[:300])
    if implementation == "h11":
        for parts in splits(head_of(MAX_HEADERS, eol="\n")):
            assert sent_in(proxy, parts).endswith(b"answered /v1/models")
        body = b"a" * 20 * 1024
        post = head_of(3, method="POST", eol="\n").replace(b"\n\n", b"\ncontent-length: %d\n\n" % len(body))
        assert sent_in(proxy, [post + body]).endswith(b"answered /v1/models")


def test_a_slow_head_gets_408_and_a_silent_connection_is_closed(proxy):
    """Issue 48: connections dripping a header a byte a second were held open for a minute; now a head must arrive
    within the head timeout: a partial one gets 408 in OpenAI's shape, a connection that sent nothing is closed."""
    with socket.create_connection(("127.0.0.1", proxy), timeout=60) as silent:
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        got, took = exchange(proxy, head, chunk=1, pause=0.5)  # a byte each 0.5 s: 63 s for the whole head
        status, err = status_and_error(got)
        assert status == 408 and err["code"] == "request_timeout", (status, err)
        assert TIMEOUT_S - 1 < took < TIMEOUT_S + 5, took
        assert silent.recv(65536) == b""  # closed, with nothing sent: it had sent nothing


def test_serves_own_paths_ask_the_key(proxy):
    """Issue 48: Serve's /-/routes answered without the key; now every /-/ path asks it (401 in OpenAI's shape) but
    Serve's health, /-/healthz, which KubeRay's operator and worker-pod probes ask without a key (as /health)."""
    url = f"http://127.0.0.1:{proxy}"
    for path in ("/-/routes", "/-/anything", "/-/healthz/x", "/-/Healthz"):
        for key in (None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=30)
            assert err.value.code == 401 and json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
        req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.read() == f"answered {path}".encode()
    for key in (None, "wrong", KEY):  # Serve's health: open, whatever the key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        with urllib.request.urlopen(urllib.request.Request(url + "/-/healthz", headers=headers), timeout=30) as r:
            assert r.read() == b"answered /-/healthz"
    with urllib.request.urlopen(url + "/health", timeout=30) as r:  # the gateway's own paths: the gateway asks
        assert r.status == 200


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer in ``raw`` (answers with a content-length, as the proxy's and the app's)."""
    found = []
    while raw.startswith(b"HTTP/1.1 "):
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(
            next(
                v for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:]) if k.lower() == b"content-length"
            )
        )
        found.append((int(head.split()[1]), rest[:length]))
        raw = rest[length:]
    return found


def pipelined(port: int, first: bytes, then: bytes, apart: float) -> list[tuple[int, bytes]]:
    """The answers to ``first`` and ``then`` sent on one connection without waiting for an answer (``apart`` seconds
    between them; 0: in one write), read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(first + (b"" if apart else then))
            if apart:
                time.sleep(apart)
                s.sendall(then)
        except OSError:  # refused and closed while the rest was being sent
            pass
        got = b""
        try:
            while data := s.recv(65536):
                got += data
        except ConnectionResetError:  # closed after a refusal, with the rest of a head unread
            pass
    return answers(got)


def test_a_pipelined_request_answered_past_the_head_timeout_is_answered(proxy):
    """A request sent behind another on one connection (pipelined) and answered after more than the head timeout
    gets its answer.  (On httptools, which parses a pipelined head at once, the head timer re-armed at the first
    answer closed the connection under the second request, which was never answered.)"""
    for apart in (0, 0.5):
        got = pipelined(
            proxy,
            b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            apart,
        )
        assert got == [(200, b"answered /fast"), (200, b"answered /slow")], (apart, got)


def test_a_pipelined_head_is_held_to_the_limits(proxy):
    """A head sent behind a request being answered is held to the same limits: 431 in OpenAI's shape.  (Before, the
    limits were checked on a connection's first head only: httptools answered a pipelined 1 MiB header or 1,000
    headers 200, h11 the 1,000 headers 200 and the 1 MiB header 400 in plain text.)"""
    slow = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
    for then in (
        b"GET /fast HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\nConnection: close\r\n\r\n",
        b"GET /fast HTTP/1.1\r\nHost: x\r\n" + b"".join(b"h%d:v\r\n" % i for i in range(1000)) + b"\r\n",
    ):
        for apart in (0.5, 0):
            got = pipelined(proxy, slow, then, apart)
            # sent apart: the first answered, then the refusal; in one write, the refusal may come first and alone
            assert got and got[-1][0] == 431, (apart, got)
            assert json.loads(got[-1][1])["error"]["code"] == "request_header_fields_too_large"
            assert got[:-1] == [(200, b"answered /slow")] or (not apart and not got[:-1]), (apart, got)
    fits = b"GET /fast HTTP/1.1\r\nHost: x\r\n" + b"".join(b"h%d:v\r\n" % i for i in range(50)) + b"\r\n"
    assert pipelined(proxy, slow, fits.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), 0.5) == [
        (200, b"answered /slow"),
        (200, b"answered /fast"),
    ]


def test_the_implementation_serves_proxy_runs_is_one_the_guard_limits():
    """Ray Serve's proxy starts uvicorn without ``http=`` ("auto": httptools where installed, else h11); the class
    that resolves to carries the guard's limits once the guard ran (as in Serve's proxy process)."""
    script = """
import uvicorn
from posfair.serve.proxy import guard
guard()
config = uvicorn.Config(lambda: None, factory=True, lifespan="off", log_level=None, log_config=None)
config.load()
cls = config.http_protocol_class
print(cls.__module__, cls.__name__, getattr(cls, "_posfair_head_limits", False))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    module, name, limited = out.stdout.split()
    try:
        import httptools  # noqa: F401, PLC0415
    except ImportError:
        assert name == "H11Protocol", out.stdout
    else:
        assert name == "HttpToolsProtocol", out.stdout
    assert limited == "True", (out.stdout, out.stderr)


@pytest.mark.parametrize(
    "raw",
    [b"NOT HTTP AT ALL\r\n\r\n", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"],
    ids=["request-line", "header-line"],
)
def test_a_request_the_parser_cannot_read_gets_400_in_openai_shape(proxy, raw):
    """Issue 58 item 7: uvicorn answered a malformed request "Invalid HTTP request received." in text/plain. Now
    the same 400, its connection closed, is JSON in OpenAI's error shape."""
    got, _ = exchange(proxy, raw)
    status, error = status_and_error(got)
    assert status == 400 and error["code"] == "invalid_http_request", got
    assert error["type"] == "invalid_request_error" and "not valid HTTP/1.1" in error["message"], error


@pytest.mark.parametrize("line", ["GET * HTTP/1.1", "OPTIONS * HTTP/1.1"])
def test_a_target_that_is_not_a_path_gets_404_in_openai_shape(proxy, line):
    """Issue 58 item 7: ``GET *`` reached Serve's proxy, which answered a text pointing at /-/routes. Now 404 in
    OpenAI's error shape, before the proxy (here: before the app, which would answer 200)."""
    got, _ = exchange(proxy, f"{line}\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    status, error = status_and_error(got)
    assert status == 404 and error["code"] == "not_found" and "*" in error["message"], got
