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
from typing import Any

from starlette.middleware import Middleware

from posfair.runtime import private_api
from posfair.runtime.private_api import SERVE_PROXY_CALLBACK_ENV
from posfair.serve.openai_api import ApiError, key_digest

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


def install_head_limits() -> None:
    """The head timeout and size limits (:data:`HEAD_TIMEOUT_S`, :data:`MAX_HEAD_BYTES`, :data:`MAX_HEADERS`) on
    uvicorn's HTTP/1.1 protocols, their refusals in OpenAI's shape (:mod:`posfair.runtime.private_api`)."""
    private_api.install_head_limits(
        private_api.HeadLimits(HEAD_TIMEOUT_S, MAX_HEAD_BYTES, MAX_HEADERS, _answer(_TIMEOUT), _answer(_TOO_BIG))
    )


def install_json_400() -> None:
    """uvicorn's parser's 400 (a request it cannot read) as JSON in OpenAI's shape, on its HTTP/1.1 protocols."""

    def answer(msg: str) -> bytes:
        why = msg.strip().rstrip(".")
        return _answer(ApiError(400, f"the request is not valid HTTP/1.1 ({why})", code="invalid_http_request"))

    private_api.install_parser_400(answer)


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
