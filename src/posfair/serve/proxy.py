"""What posfair adds to Ray Serve's HTTP proxy (the process that listens on ``--host``/``--port``): limits on a
request's head and the API key on Serve's own paths.

Ray Serve runs the callback named by its ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` environment variable when
its proxy starts (``posfair serve`` sets it to :func:`guard` for the Ray instance it starts; on a cluster, or under
``serve run`` / a RayService, set it where Ray starts).  :func:`guard` does three things in the proxy's process:

* every connection must send a whole request head (request line and headers) within :data:`HEAD_TIMEOUT_S` of
  connecting, or of the end of its previous answer; a head of more than :data:`MAX_HEAD_BYTES` bytes or
  :data:`MAX_HEADERS` header lines is refused as soon as it is seen (431), before it is parsed.  A connection past
  the time is closed, with a 408 when it had sent part of a head (a slow drip), silently when it had sent nothing.
  Both answers are JSON in OpenAI's error shape, as every refusal of the gateway.  A request sent behind another on
  one connection (pipelined) is held to the same limits, its time counted from the previous answer.  (Ray Serve
  passes no such option to its HTTP server, uvicorn, so the limits sit on uvicorn's protocol classes, in the proxy's
  process only: on both of its HTTP/1.1 implementations, httptools (what Serve runs where it is installed: it
  starts uvicorn with ``http="auto"``) and h11.)
* a Starlette middleware (:class:`KeyOnServePaths`) asks the API key on Serve's own paths (``/-/routes``, any
  ``/-/...``), which the proxy answers itself without reaching the gateway: the key's SHA-256 is read from
  ``POSFAIR_SERVE_KEY_SHA256`` (what ``posfair serve`` sets), or the key from the variable named by
  ``POSFAIR_SERVE_API_KEY_ENV``; neither set: no key asked (as the gateway).  ``/health`` stays open, as the gateway
  answers it, and so does Serve's ``/-/healthz`` (:data:`OPEN_SERVE_PATHS`: it says "success" and nothing else, and
  KubeRay asks it without a key: its operator's check of the head pod's proxy, which puts the pod behind the
  RayService's serve Service, and the readiness probe it gives worker pods).  A request whose target is not a path
  (``GET *``, a full URL) gets 404 in OpenAI's shape there too, and a request uvicorn's parser cannot read gets its
  400 as JSON in OpenAI's shape (:func:`install_json_400`), not uvicorn's text.
* whose ``X-Forwarded-For`` the proxy believes (:func:`trust_forwarded`): no one's unless ``posfair serve
  --trusted-proxy`` names them (``POSFAIR_SERVE_TRUSTED_PROXIES``) or ``FORWARDED_ALLOW_IPS`` is set, so a client on
  this machine cannot name itself anyone to take another fair share of the replicas per name.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from typing import Any

import h11
from starlette.middleware import Middleware
from uvicorn.protocols.http.h11_impl import H11Protocol

from posfair.runtime.private_api import SERVE_PROXY_CALLBACK_ENV
from posfair.serve.openai_api import ApiError, key_digest

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn runs h11
    HttpToolsProtocol = None

__all__ = [
    "CALLBACK_ENV",
    "HEAD_TIMEOUT_S",
    "KEY_ENV_ENV",
    "KEY_SHA256_ENV",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "OPEN_SERVE_PATHS",
    "TRUSTED_PROXIES_ENV",
    "KeyOnServePaths",
    "guard",
    "install_head_limits",
    "install_json_400",
    "trust_forwarded",
]

#: Ray Serve's environment variable naming a callback its HTTP proxy runs at start (returning Starlette middlewares)
CALLBACK_ENV = SERVE_PROXY_CALLBACK_ENV
#: the key's SHA-256, for the proxy (``posfair serve`` sets it; the key itself reaches no Ray process)
KEY_SHA256_ENV = "POSFAIR_SERVE_KEY_SHA256"
#: ... or the name of the variable holding the key (a RayService: the variable a secret fills)
KEY_ENV_ENV = "POSFAIR_SERVE_API_KEY_ENV"
#: the longest a connection may take to send a request head (from connecting, or from its previous answer)
HEAD_TIMEOUT_S = 10.0
#: the largest request head, in bytes: its request line, header lines and the blank line that ends them (h11 itself
#: refuses a partial head of more, with a plain 400: the limit is checked first)
MAX_HEAD_BYTES = 16 * 1024
#: the most header lines in one request (the request line and the blank line not counted)
MAX_HEADERS = 100
#: Serve's own paths open without the key: its proxy's health ("success"), what KubeRay asks without a key
OPEN_SERVE_PATHS = frozenset({"/-/healthz"})
#: the reverse proxies whose ``X-Forwarded-For`` the server believes (addresses or networks, comma-separated;
#: ``posfair serve --trusted-proxy``); unset: no one's, unless ``FORWARDED_ALLOW_IPS`` is set (see :func:`guard`)
TRUSTED_PROXIES_ENV = "POSFAIR_SERVE_TRUSTED_PROXIES"
#: uvicorn's own variable for the same (read when Serve's proxy creates its uvicorn.Config, after :func:`guard`)
FORWARDED_ENV = "FORWARDED_ALLOW_IPS"


def _answer(err: ApiError) -> bytes:
    """A whole HTTP/1.1 answer carrying ``err`` in OpenAI's error shape; the connection is closed after it."""
    body = json.dumps(err.body()).encode()
    reason = {400: "Bad Request", 401: "Unauthorized", 408: "Request Timeout", 431: "Request Header Fields Too Large"}[
        err.status
    ]
    head = (
        f"HTTP/1.1 {err.status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_TIMEOUT = ApiError(
    408,
    f"the request head (request line and headers) did not arrive within {HEAD_TIMEOUT_S:g} s",
    code="request_timeout",
)
_TOO_BIG = ApiError(
    431,
    f"the request head is over {MAX_HEAD_BYTES} bytes or {MAX_HEADERS} header lines",
    code="request_header_fields_too_large",
)


class _Head:
    """One connection's wait for a request head: the bytes of it seen so far, the timer that ends the wait."""

    def __init__(self, proto: Any):
        self.cycle = getattr(proto, "cycle", None)  # uvicorn's current request; a new one: a head was parsed
        self.seen = b""
        self.done = False
        self.timer = proto.loop.call_later(HEAD_TIMEOUT_S, _expire, proto, self)


def _arm(proto: Any) -> None:
    old = getattr(proto, "_posfair_head", None)
    if old is not None:
        old.timer.cancel()
    proto._posfair_head = _Head(proto)


def _refuse(proto: Any, err: ApiError) -> None:
    head = proto._posfair_head
    head.done = True
    head.timer.cancel()
    if not proto.transport.is_closing():
        proto.transport.write(_answer(err))
        proto.transport.close()


def _expire(proto: Any, head: _Head) -> None:
    """The head timer: a connection still waiting for its head is closed (408 if part of one arrived)."""
    if head.done or proto._posfair_head is not head or getattr(proto, "cycle", None) is not head.cycle:
        return
    if proto.transport.is_closing():
        return
    if head.seen:
        _refuse(proto, _TIMEOUT)
    else:
        head.done = True
        proto.transport.close()


#: the blank line that ends a head, as h11 finds it (a line ends with LF, its CR optional: h11 takes bare LFs)
_HEAD_END = re.compile(b"\n\r?\n")


def _scan(proto: Any, head: _Head, data: bytes) -> bool:
    """``data``, the next bytes of the head ``head`` waits for: False (refused, 431) when the head is over the limits,
    else True (the head whole: the timer stops; the parser takes it from here).

    A head's size is its bytes up to and with its blank line; its header lines are its lines (each ending with LF)
    but the request line and the blank line.  Of a head not yet whole, what was seen is counted (its lines ended
    by an LF: a line's last LF may be the start of the blank line), so a head is refused as soon as it is over
    and never for how its bytes were split."""
    seen = head.seen + data
    end = _HEAD_END.search(seen)
    size = len(seen) if end is None else end.end()
    lines = seen.count(b"\n", 0, size) - (1 if end is None else 2)
    if size > MAX_HEAD_BYTES or lines > MAX_HEADERS:
        _refuse(proto, _TOO_BIG)
        return False
    if end is None:
        head.seen = seen
    else:
        head.done = True
        head.timer.cancel()
    return True


def _in_flight(proto: Any) -> bool:
    """A request of this connection is being answered, its body all received (what arrives now is a next request)."""
    cycle = getattr(proto, "cycle", None)
    return cycle is not None and not cycle.response_complete and not cycle.more_body


def _wrap(cls: type) -> None:
    """Head limits on one of uvicorn's HTTP/1.1 protocol classes (once).

    Bytes that arrive while a request is answered, its body whole (a pipelined next request), are held, reading
    paused, until the answer is complete, and then go through the same checks as any head: no parser sees a next
    head before its limits are checked (httptools parses ahead at once, h11 once the answer is complete; either
    would take an unchecked head).  Where a next request began in the bytes that ended the previous body (so the
    parser had them), the parser's own view is checked: h11's unparsed bytes when the answer completes, httptools'
    headers when its head ends."""
    if getattr(cls, "_posfair_head_limits", False):
        return
    made, received, complete, lost = (
        cls.connection_made,
        cls.data_received,
        cls.on_response_complete,
        cls.connection_lost,
    )

    def connection_made(self, transport):
        made(self, transport)
        self._posfair_held = b""
        _arm(self)

    def data_received(self, data):
        if self.transport.is_closing():  # refused (or closing): nothing more is parsed
            return
        head = getattr(self, "_posfair_head", None)
        if head is not None and head.done and _in_flight(self):
            self._posfair_held += data
            self.flow.pause_reading()
            return
        if head is not None and not head.done and not _scan(self, head, data):
            return
        received(self, data)

    def on_response_complete(self):
        if self.transport.is_closing():
            complete(self)
            return
        _arm(self)  # the next request on this connection: its head in time too, and within the limits
        conn = getattr(self, "conn", None)  # h11: the bytes of a next request it holds unparsed
        pending = conn.trailing_data[0] if conn is not None and conn.their_state is h11.DONE else b""
        if pending and not _scan(self, self._posfair_head, bytes(pending)):
            return
        complete(self)  # may start a next request whose head the parser had already
        if getattr(self, "cycle", None) is not None and not self.cycle.response_complete:
            self._posfair_head.done = True  # a request is being answered: no head is waited for
            self._posfair_head.timer.cancel()
        held, self._posfair_held = self._posfair_held, b""
        if held and not self.transport.is_closing():
            self.data_received(held)

    def connection_lost(self, exc):
        head = getattr(self, "_posfair_head", None)
        if head is not None:
            head.done = True
            head.timer.cancel()
        lost(self, exc)

    cls.connection_made = connection_made
    cls.data_received = data_received
    cls.on_response_complete = on_response_complete
    cls.connection_lost = connection_lost
    if hasattr(cls, "on_headers_complete"):  # httptools: a head it parsed ahead, checked as a whole
        headers_complete = cls.on_headers_complete

        def on_headers_complete(self):
            # the head's bytes as sent in the usual form ("name: value" lines, CRLFs), its blank line included
            line = len(self.parser.get_method()) + len(self.url) + len(self.parser.get_http_version()) + 11
            size = line + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if len(self.headers) > MAX_HEADERS or size > MAX_HEAD_BYTES:
                _refuse(self, _TOO_BIG)
                self._posfair_refused = True
                return
            if getattr(self, "_posfair_refused", False):
                return
            headers_complete(self)

        cls.on_headers_complete = on_headers_complete
    cls._posfair_head_limits = True


def install_head_limits() -> None:
    """The head timeout and size limits on uvicorn's HTTP/1.1 protocols (h11, and httptools where installed)."""
    for cls in (H11Protocol, HttpToolsProtocol):
        if cls is not None:
            _wrap(cls)


# -- uvicorn internals: the parser's own 400 in OpenAI's shape (issue 58 item 7) ---------------------------------------
# uvicorn's HTTP/1.1 protocols (h11 and httptools) answer a request their parser cannot read by calling
# ``self.send_400_response(msg)``, which writes a text/plain 400 ("Invalid HTTP request received.") and closes the
# connection.  Serve's proxy reaches no ASGI app for it (no middleware sees it), so the method is replaced on both
# classes, in the proxy's process only (:func:`guard`).


def _send_400_response(self: Any, msg: str) -> None:
    """uvicorn's ``send_400_response``: the same 400, its connection closed after it, as JSON in OpenAI's shape."""
    err = ApiError(400, f"the request is not valid HTTP/1.1 ({msg.strip().rstrip('.')})", code="invalid_http_request")
    head = getattr(self, "_posfair_head", None)
    if head is not None:  # no head is waited for any more on this connection
        head.done = True
        head.timer.cancel()
    if not self.transport.is_closing():
        self.transport.write(_answer(err))
        self.transport.close()


def install_json_400() -> None:
    """The parser's 400 as JSON in OpenAI's shape on uvicorn's HTTP/1.1 protocols (h11, and httptools)."""
    for cls in (H11Protocol, HttpToolsProtocol):
        if cls is not None and hasattr(cls, "send_400_response"):
            cls.send_400_response = _send_400_response


# -- end of the uvicorn internals ------------------------------------------------------------------------------------


def trust_forwarded() -> None:
    """Whose ``X-Forwarded-For`` Serve's proxy believes, set in its process before it creates its uvicorn.Config
    (which reads ``FORWARDED_ALLOW_IPS`` then, and by default trusts 127.0.0.1 and ::1: any client on this machine
    could then name itself anyone and take a fair share of the replicas per name, :mod:`posfair.serve.sharing`).

    ``POSFAIR_SERVE_TRUSTED_PROXIES`` set (``posfair serve --trusted-proxy``): those addresses, the client address of
    a request from one of them read from its ``X-Forwarded-For``; else a ``FORWARDED_ALLOW_IPS`` the user set is
    left as it is; else no one: every request's client is the address that connected."""
    trusted = os.environ.get(TRUSTED_PROXIES_ENV)
    if trusted is not None:
        os.environ[FORWARDED_ENV] = ",".join(a.strip() for a in trusted.split(",") if a.strip())
    elif FORWARDED_ENV not in os.environ:
        os.environ[FORWARDED_ENV] = ""  # uvicorn trusts no address then (an empty host is never trusted)


def _key_sha256() -> str | None:
    digest = os.environ.get(KEY_SHA256_ENV, "").strip()
    if digest:
        return digest
    var = os.environ.get(KEY_ENV_ENV, "").strip()
    key = os.environ.get(var, "").strip() if var else ""
    return key_digest(key) if key else None


class KeyOnServePaths:
    """ASGI middleware: Serve's own paths (``/-/...``, :data:`OPEN_SERVE_PATHS` aside) only with ``Authorization:
    Bearer KEY`` (401 in OpenAI's shape otherwise), when a key is set; a request whose target is not a path (``GET
    *``, a full URL: Serve's proxy would answer a text pointing at ``/-/routes``) gets 404 in OpenAI's shape;
    everything else passes to the proxy untouched (the gateway checks it)."""

    def __init__(self, app: Any, key_sha256: str | None = None):
        self.app, self.key_sha256 = app, key_sha256

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope.get("type") == "http" and not path.startswith("/"):
            where = f"{scope.get('method', '')} {path}".strip()
            await _send_error(send, ApiError(404, f"{where}: not a path of this server", code="not_found"))
            return
        if (
            scope.get("type") != "http"
            or self.key_sha256 is None
            or not path.startswith("/-/")
            or path in OPEN_SERVE_PATHS
        ):
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"").decode("latin-1")
        scheme, _, key = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(key_digest(key.strip()), self.key_sha256):
            await self.app(scope, receive, send)
            return
        err = ApiError(
            401, "a valid API key is needed: send 'Authorization: Bearer KEY'", param=None, code="invalid_api_key"
        )
        await _send_error(send, err)


async def _send_error(send: Any, err: ApiError) -> None:
    """``err`` answered through ASGI's ``send``, JSON in OpenAI's shape."""
    body = json.dumps(err.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": err.status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guard() -> list[Middleware]:
    """Ray Serve's proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=posfair.serve.proxy:guard``): the
    head limits and the parser's 400 in OpenAI's shape installed in the proxy's process, whose ``X-Forwarded-For``
    it believes (:func:`trust_forwarded`), and the key middleware for Serve's own paths."""
    install_head_limits()
    install_json_400()
    trust_forwarded()
    return [Middleware(KeyOnServePaths, key_sha256=_key_sha256())]
