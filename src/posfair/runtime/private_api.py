"""Every private name of Ray, Ray Serve and uvicorn that posfair relies on, in this one module.

Each is used only because no public way does the same; each is pinned (``pyproject.toml`` bounds Ray and uvicorn
to the release lines :data:`TESTED_RAY` and :data:`TESTED_UVICORN` the suite ran on) and checked by the suite
(``tests/test_private_api.py``), which fails, naming the name, when a release removes or changes one.  What each
does for posfair:

* :data:`RAY_LOCAL_ONLY_ENV` -- Ray's switch (``ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR``) for an
  instance of one machine: "0" gives the node the address 127.0.0.1, so ``posfair serve --host 127.0.0.1`` keeps
  its GCS, raylet and workers on the loopback.  No public option of ``ray.init`` does it.
* :func:`replica_grpc_on_loopback` -- on such an instance, each Serve replica's inter-deployment gRPC server
  listens on 127.0.0.1 instead of every interface (``ray.serve._private.replica.add_port_to_grpc_server``).
* :data:`SERVE_PROXY_CALLBACK_ENV` -- the variable naming a callback Serve's HTTP proxy runs when it starts
  (``ray.serve._private.constants.RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``): posfair's guard of the proxy
  (head limits, the key on Serve's own paths, which proxy to trust).  ``http_options.middlewares`` is the public
  way to add middleware, but it cannot run code in the proxy's process before uvicorn starts.
* :func:`serve_instance_details` -- where a running Serve instance listens and routes, asked of its controller
  (``get_serve_instance_details``, what Serve's REST API answers; ``serve.status()`` says neither).
* :func:`quiet_ray_start` -- two notices of ``ray.init`` that ask nothing of a posfair user, by the names of the
  loggers that print them (``ray._private.worker``, ``ray._private.authentication.authentication_token_setup``).
* :func:`install_head_limits` and :func:`install_parser_400` -- uvicorn's HTTP/1.1 protocol classes (h11's and
  httptools', ``uvicorn.protocols.http``), in Serve's proxy process: a request head must arrive within a time and
  stay within a size and a number of lines (Serve gives uvicorn no such option; uvicorn has none for the time), and
  the parser's own 400 is answered in the server's error shape (uvicorn writes it in text before any ASGI app or
  middleware sees the request).  Methods of those classes are wrapped (``connection_made``, ``data_received``,
  ``on_response_complete``, ``connection_lost``, httptools' ``on_headers_complete``, ``send_400_response``) and
  their state read (the current request ``cycle``, h11's ``conn``, httptools' ``parser``, ``url`` and
  ``headers``, the ``transport`` and its ``flow`` control).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "TESTED_UVICORN",
    "HeadLimits",
    "http11_protocols",
    "install_head_limits",
    "install_parser_400",
    "RAY_LOCAL_ONLY_ENV",
    "SERVE_CONTROLLER",
    "SERVE_NAMESPACE",
    "SERVE_PROXY_CALLBACK_ENV",
    "TESTED_RAY",
    "quiet_ray_start",
    "replica_grpc_on_loopback",
    "serve_instance_details",
]

#: the release line of Ray these names were checked on (pyproject.toml pins Ray to it)
TESTED_RAY = "2.60"
#: ... and of uvicorn
TESTED_UVICORN = "0.55"
#: Ray's switch for an instance of one machine alone (its default on macOS and Windows); read once, at import
RAY_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Serve's variable naming a callback its HTTP proxy runs at start (returning Starlette middlewares)
SERVE_PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
#: Serve's controller actor and its namespace, as Serve's fault-tolerance guide names them
SERVE_CONTROLLER, SERVE_NAMESPACE = "SERVE_CONTROLLER_ACTOR", "serve"
#: the logger of ``ray.init``'s notice "SIGTERM handler is not set because current thread is not the main thread"
WORKER_LOGGER = "ray._private.worker"
OFF_MAIN_NOTICE = "SIGTERM handler is not set"
#: the logger of the notice "Token authentication is enabled for this Ray cluster ..." of every local ray.init()
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
#: the function a Serve replica binds its gRPC server with, and the address it gives it (every interface)
GRPC_BIND, GRPC_EVERY_INTERFACE = "add_port_to_grpc_server", "[::]:0"


class _NoOffMainNotice(logging.Filter):
    """Drops Ray's notice that ``ray.init`` ran off the main thread (every other record passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(OFF_MAIN_NOTICE)


@contextlib.contextmanager
def quiet_ray_start(off_main: bool = True) -> Iterator[None]:
    """Within (unless posfair logs at DEBUG: ``--debug``, or the user configured Ray's logger): no token-
    authentication notice from ``ray.init`` (about Ray's own security default) and, with ``off_main``, no notice
    that its SIGTERM handler is not set because it runs off the main thread (``posfair serve`` starts Ray in a
    helper thread on purpose and handles SIGINT and SIGTERM itself)."""
    if logging.getLogger("posfair").isEnabledFor(logging.DEBUG):
        yield
        return
    auth, worker, quiet = logging.getLogger(AUTH_LOGGER), logging.getLogger(WORKER_LOGGER), _NoOffMainNotice()
    auth_set = auth.level == logging.NOTSET
    if auth_set:
        auth.setLevel(logging.ERROR)
    if off_main:
        worker.addFilter(quiet)
    try:
        yield
    finally:
        if auth_set:
            auth.setLevel(logging.NOTSET)
        worker.removeFilter(quiet)


def serve_instance_details(timeout_s: float) -> dict[str, Any]:
    """The running Serve controller's ``ServeInstanceDetails`` (as a dict: ``http_options``, ``applications``
    with their ``route_prefix``), waited for at most ``timeout_s``."""
    import ray

    controller = ray.get_actor(SERVE_CONTROLLER, namespace=SERVE_NAMESPACE)
    return ray.get(controller.get_serve_instance_details.remote(), timeout=timeout_s)


def replica_grpc_on_loopback() -> None:
    """On a Ray instance kept on the loopback (:data:`RAY_LOCAL_ONLY_ENV` "0"), this replica's inter-deployment
    gRPC server listens on 127.0.0.1.

    Ray Serve 2.60 starts that server in every replica on ``[::]:0`` -- every interface -- with no option to say
    otherwise, once the deployment's constructor has run; called first in each constructor, this hands it the
    loopback instead.  Where Serve has no such function, or binds another address, nothing changes."""
    if os.environ.get(RAY_LOCAL_ONLY_ENV) != "0":
        return
    import ray.serve._private.replica as replica  # noqa: PLC0415 -- see the module's description

    bind = getattr(replica, GRPC_BIND, None)
    if bind is None or getattr(bind, "posfair_loopback", False):
        return

    def on_loopback(server: Any, address: str) -> Any:
        return bind(server, "127.0.0.1:0" if address == GRPC_EVERY_INTERFACE else address)

    on_loopback.posfair_loopback = True  # type: ignore[attr-defined]
    setattr(replica, GRPC_BIND, on_loopback)


# -- uvicorn: its HTTP/1.1 protocol classes, in Serve's proxy process ------------------------------------------------

#: the methods of uvicorn's HTTP/1.1 protocols that are wrapped or replaced, and the state of theirs that is read
UVICORN_METHODS = ("connection_made", "data_received", "on_response_complete", "connection_lost", "send_400_response")
UVICORN_ATTRIBUTES = ("cycle", "transport", "flow", "loop")
#: ... per class (h11's connection, httptools' parser and the head it parsed)
UVICORN_CLASS_ATTRIBUTES = {"H11Protocol": ("conn",), "HttpToolsProtocol": ("parser", "url", "headers")}


def http11_protocols() -> tuple[type, ...]:
    """uvicorn's HTTP/1.1 protocol classes: h11's, and httptools' where httptools is installed (what uvicorn's
    ``http="auto"``, Serve's choice, runs then)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools not installed: uvicorn runs h11
        return (H11Protocol,)
    return (H11Protocol, HttpToolsProtocol)


@dataclasses.dataclass(frozen=True)
class HeadLimits:
    """The limits on a request head (its time, bytes and header lines) and the whole HTTP answers written when a
    head is over them (the connection is closed after either)."""

    timeout_s: float
    max_bytes: int
    max_headers: int
    timed_out: bytes  # a part of a head arrived, not all of it in time
    too_big: bytes


_LIMITS: HeadLimits | None = None


def _limits() -> HeadLimits:
    assert _LIMITS is not None, "install_head_limits sets the limits before any connection"
    return _LIMITS


def _h11_done() -> Any:
    import h11

    return h11.DONE


class _Head:
    """One connection's wait for a request head: the bytes of it seen so far, the timer that ends the wait."""

    def __init__(self, proto: Any):
        self.cycle = getattr(proto, "cycle", None)  # uvicorn's current request; a new one: a head was parsed
        self.seen = b""
        self.done = False
        self.timer = proto.loop.call_later(_limits().timeout_s, _expire, proto, self)


def _arm(proto: Any) -> None:
    old = getattr(proto, "_posfair_head", None)
    if old is not None:
        old.timer.cancel()
    proto._posfair_head = _Head(proto)


def _refuse(proto: Any, answer: bytes) -> None:
    head = proto._posfair_head
    head.done = True
    head.timer.cancel()
    if not proto.transport.is_closing():
        proto.transport.write(answer)
        proto.transport.close()


def _expire(proto: Any, head: _Head) -> None:
    """The head timer: a connection still waiting for its head is closed (408 if part of one arrived)."""
    if head.done or proto._posfair_head is not head or getattr(proto, "cycle", None) is not head.cycle:
        return
    if proto.transport.is_closing():
        return
    if head.seen:
        _refuse(proto, _limits().timed_out)
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
    if size > _limits().max_bytes or lines > _limits().max_headers:
        _refuse(proto, _limits().too_big)
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
        pending = conn.trailing_data[0] if conn is not None and conn.their_state is _h11_done() else b""
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
            if len(self.headers) > _limits().max_headers or size > _limits().max_bytes:
                _refuse(self, _limits().too_big)
                self._posfair_refused = True
                return
            if getattr(self, "_posfair_refused", False):
                return
            headers_complete(self)

        cls.on_headers_complete = on_headers_complete
    cls._posfair_head_limits = True


def install_head_limits(limits: HeadLimits) -> None:
    """The head timeout and size limits on uvicorn's HTTP/1.1 protocols (h11, and httptools where installed), in
    this process (Serve's proxy: posfair.serve.proxy.guard)."""
    global _LIMITS
    _LIMITS = limits
    for cls in http11_protocols():
        _wrap(cls)


def install_parser_400(answer: Callable[[str], bytes]) -> None:
    """uvicorn's ``send_400_response(msg)`` -- its answer to a request its parser cannot read, a text/plain 400
    that no ASGI app sees -- replaced on its HTTP/1.1 protocols: ``answer(msg)`` (a whole HTTP answer) is written
    instead, and the connection closed after it, as uvicorn closes it."""

    def send_400_response(self: Any, msg: str) -> None:
        head = getattr(self, "_posfair_head", None)
        if head is not None:  # no head is waited for any more on this connection
            head.done = True
            head.timer.cancel()
        if not self.transport.is_closing():
            self.transport.write(answer(msg))
            self.transport.close()

    for cls in http11_protocols():
        if hasattr(cls, "send_400_response"):
            cls.send_400_response = send_400_response
