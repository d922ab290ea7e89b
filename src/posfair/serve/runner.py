"""``posfair serve``: start the application of :func:`posfair.serve.application.app`, serve, stop.

:func:`serve_model` starts (or connects to) Ray, starts Serve's HTTP proxy on ``host:port`` and runs the one
application (``serve.run``: the gateway answers 503 within seconds while the model replicas load), calls
``on_listening(url)`` once the gateway answers and ``on_ready(url)`` once the application runs, then serves
until ``stop`` is set or the process gets SIGINT / SIGTERM -- watching Ray meanwhile: Ray's controller not
answering (a killed raylet or GCS) ends the server with :class:`ServerFailed`, one line, instead of a process
that neither serves nor exits.  Every Ray call that can wait runs in a helper thread, so the signals are
honoured in every state.  On the way out the gateway drains (new requests 503 "stopping", those in flight
finish), then Ray is shut down when posfair started it (the instance and every process of it end with the
command), or on a running cluster the application is deleted (and the Serve instance it started, if no other
application runs on it); the whole stop is bounded (:data:`STOP_TIMEOUT_S`).

A Ray instance the server starts itself runs :mod:`posfair.serve.proxy`'s guard in Serve's HTTP proxy (head
limits and timeout, the key on Serve's own ``/-/`` paths), and, when ``--host`` is a loopback address, listens
on the loopback only -- its GCS, raylet, workers and replicas too (:func:`loopback_only`): nothing of it is
reachable from another machine.

On a running cluster (``--ray-address``), :func:`connect` joins it and :func:`serve_conflict` says
why posfair cannot serve there -- before the command loads anything: a Serve instance already on the
cluster keeps the address it started with (Serve ignores a new one), may already run a posfair server
(whose application this one would replace), or route ``/`` to another application.
"""

from __future__ import annotations

import dataclasses
import gc
import ipaddress
import json
import logging
import os
import resource
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from posfair.runtime.errors import install_hint
from posfair.runtime.private_api import RAY_LOCAL_ONLY_ENV, quiet_ray_start, serve_instance_details

logger = logging.getLogger("posfair.serve")

__all__ = [
    "SERVE_INSTALL_HINT",
    "RunningServe",
    "ServeConflict",
    "ServerFailed",
    "ServerSettings",
    "cluster_conflict",
    "connect",
    "running_serve",
    "serve_available",
    "serve_conflict",
    "check_open_files",
    "loopback_only",
    "serve_model",
    "unfinished",
]

SERVE_INSTALL_HINT = install_hint("serve")


def serve_available() -> bool:
    """Whether Ray Serve and its HTTP stack import (without starting anything)."""
    try:
        import fastapi  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Everything a server runs with (checked by the command before it starts): the application's arguments
    (:class:`posfair.serve.application.AppArgs`) and where it listens."""

    args: Any  # AppArgs
    host: str = "127.0.0.1"
    port: int = 8000
    ray_address: str | None = None

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    @property
    def served_name(self) -> str:
        return self.args.served_name


class ServerFailed(RuntimeError):
    """The server could not start, or Ray failed under it: one line saying why (``posfair serve`` exits 1).
    ``ray_failed``: Ray itself no longer answers (the stop then waits for it only briefly)."""

    def __init__(self, message: str, ray_failed: bool = False):
        super().__init__(message)
        self.ray_failed = ray_failed


#: the longest a stop takes (draining the gateway, then Ray's shutdown) before the process ends regardless
STOP_TIMEOUT_S = 25.0
#: the longest a start may take (Ray, the HTTP proxy, the model replicas loading) before the server gives up
START_TIMEOUT_S = 900.0
#: ... after Ray failed under the server
FAULT_STOP_S = 5.0
_UNFINISHED = False
#: the longest the server waits for Ray's controller to answer before it calls Ray failed (twice in a row)
RAY_ANSWER_S = 10.0
#: how often the running server asks Ray's controller how its application is
WATCH_PERIOD_S = 2.0


class ServeConflict(RuntimeError):
    """The cluster's running Serve instance and this server cannot go together (see :func:`serve_conflict`)."""


def connect(address: str | None, env: dict[str, str] | None = None, loopback: bool = False) -> bool:
    """Start a local Ray instance (``address`` None or ``local``) or join the cluster at ``address``, unless this
    process is in one already (then False); Serve's INFO lines, and Ray's notice that it starts off the main thread
    (:func:`posfair.runtime.private_api.quiet_ray_start`), are hidden unless posfair logs at DEBUG.  A local
    instance is started with ``env`` in its processes' environment and, with ``loopback``, on the loopback only
    (:func:`loopback_only` must have been called before Ray was imported; :class:`ServerFailed` otherwise)."""
    import ray

    if not logging.getLogger("posfair").isEnabledFor(logging.DEBUG):
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if ray.is_initialized():
        return False
    local = address in (None, "local")
    if local:
        os.environ.update(env or {})  # Ray's processes (GCS, raylet, workers) inherit the environment at start
    with quiet_ray_start():
        ray.init(
            address="local" if local else address,  # its own instance, never a `ray start` cluster of this machine
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    node = ray.util.get_node_ip_address()
    if local and loopback and not _is_loopback(node):
        ray.shutdown()
        raise ServerFailed(
            f"Ray started on {node}, not on the loopback only (Ray was imported before posfair could ask it to; "
            "call posfair.serve.runner.loopback_only first), so its ports would listen on every interface"
        )
    return True


def _is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_only(host: str, address: str | None) -> bool:
    """Whether a server on ``host`` with Ray at ``address`` keeps its own Ray instance on the loopback (a loopback
    ``host``, no ``address``).  Ray's switch for it is set in this process's environment then, and also to join a
    Ray instance at a loopback ``address`` (``127.0.0.1:PORT``: Ray reaches such an instance only with it) -- before
    Ray is imported (``posfair serve`` calls this first), as Ray reads the switch once."""
    local = address in (None, "local")
    joins_loopback = not local and "://" not in address and _is_loopback(address.rpartition(":")[0] or address)
    if joins_loopback or (local and _is_loopback(host)):
        os.environ[RAY_LOCAL_ONLY_ENV] = "0"
    return local and _is_loopback(host)


def proxy_env(settings: ServerSettings) -> dict[str, str]:
    """The environment a Ray instance of the server's own starts with: Serve's HTTP proxy runs posfair's guard
    (:func:`posfair.serve.proxy.guard`), which asks the key (its SHA-256 only) on Serve's own paths."""
    from posfair.serve.proxy import CALLBACK_ENV, KEY_SHA256_ENV, TRUSTED_PROXIES_ENV

    env = {CALLBACK_ENV: "posfair.serve.proxy:guard"}
    if settings.args.key_sha256:
        env[KEY_SHA256_ENV] = settings.args.key_sha256
    if settings.args.trusted_proxies:  # else none trusted, unless FORWARDED_ALLOW_IPS is set (proxy.trust_forwarded)
        env[TRUSTED_PROXIES_ENV] = ",".join(settings.args.trusted_proxies)
    return env


def cluster_conflict(address: str, host: str, port: int) -> str | None:
    """Joins the cluster at ``address`` for a moment: why a server on ``host:port`` cannot run there (None: it can).
    ``ConnectionError`` when no cluster answers at ``address``."""
    import ray

    joined = connect(address)
    try:
        return serve_conflict(host, port, running_serve())
    finally:
        if joined:
            gc.collect()
            ray.shutdown()  # this driver only: the cluster stays


@dataclasses.dataclass(frozen=True)
class RunningServe:
    """A Serve instance found on the cluster: where its HTTP proxy listens, its applications and their routes."""

    host: str
    port: int
    routes: dict[str, str | None]  # application name -> its route prefix (None: no HTTP route)

    @property
    def url(self) -> str:
        return _url(self.host, self.port)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def running_serve() -> RunningServe | None:
    """The Serve instance already running on the connected cluster, or None: Serve's public status
    (``serve.status()``: its proxies and applications), and where it listens and routes from its controller's
    details in Serve's public schema (``ServeInstanceDetails``, what Serve's REST API answers; asked of the
    controller by :func:`posfair.runtime.private_api.serve_instance_details`, as no public call says it)."""
    from ray import serve
    from ray.serve.schema import ServeInstanceDetails

    status = serve.status()  # no controller: an empty status (nothing started)
    if not status.proxies and not status.applications:
        return None
    details = ServeInstanceDetails(**serve_instance_details(RAY_ANSWER_S))
    http = details.http_options
    return RunningServe(http.host, int(http.port), {n: a.route_prefix for n, a in details.applications.items()})


def serve_conflict(host: str, port: int, found: RunningServe | None) -> str | None:
    """Why this server cannot run beside the Serve instance ``found`` on the cluster (None: it can).

    A Serve instance keeps the host and port it started with (Serve ignores new ones), so this server joins
    it only where it listens already; it never replaces another posfair server's applications, nor takes
    route ``/`` from another application."""
    from posfair.serve.deployments import APP

    if found is None:
        return None
    here = f"Ray Serve already runs on this cluster, listening at {found.url}"
    ours = sorted(set(found.routes) & {APP, "posfair-encoder"})
    if ours:
        return f"{here} with a posfair server (application {ours[0]!r}); stop that server first"
    if (found.host, found.port) != (host, port):
        return (
            f"{here}, not at {_url(host, port)} (a Serve instance keeps the address it started with): pass --host "
            f"{found.host} --port {found.port} to serve there, or stop it (`serve shutdown`) first"
        )
    root = sorted(n for n, r in found.routes.items() if r == "/")
    if root:
        return f"{here}, and its application {root[0]!r} takes the route '/' this server needs"
    return None


def serve_model(
    settings: ServerSettings,
    on_ready: Callable[[str], None],
    stop: threading.Event | None = None,
    on_listening: Callable[[str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> None:
    """Serve until ``stop`` is set or SIGINT / SIGTERM arrives (see the module's description): ``on_listening(url)``
    once the gateway answers (503 while the model loads), ``on_ready(url)`` once the model replicas run,
    ``on_note(line)`` when the application's health changes.  :class:`ServerFailed` when the server cannot start or
    Ray fails under it; :class:`ServeConflict` when the cluster changed since the command checked it.

    Every wait of Ray's happens in a helper thread: the main thread only waits on events, so SIGINT and SIGTERM are
    honoured in every state (starting, loading, serving, a Ray fault), and every stop is bounded
    (:data:`STOP_TIMEOUT_S`)."""
    stop = stop or threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def take_signals() -> None:
        for s in old:
            signal.signal(s, lambda signum, frame: stop.set())

    if in_main:
        take_signals()
    state, failed = _Start(settings), False
    starter = threading.Thread(target=state.run, name="posfair-serve-start", daemon=True)
    try:
        starter.start()
        listening, taken = False, False
        deadline = time.monotonic() + START_TIMEOUT_S
        while not stop.is_set() and not state.done.is_set():
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"the server did not start within {START_TIMEOUT_S:g} s (Ray, or the model replicas, never came "
                    "up); see Ray's logs",
                    ray_failed=True,
                )
            if in_main and not taken and state.connected.is_set():  # again: Ray's start set handlers of its own
                take_signals()
                taken = True
            if not listening and state.proxy_up.is_set() and _answers(settings):
                listening = True
                (on_listening or (lambda url: None))(settings.url)
            stop.wait(0.1)
        if stop.is_set():
            return
        if state.error is not None:
            raise state.error
        if in_main and not taken:
            take_signals()
        if not listening:
            (on_listening or (lambda url: None))(settings.url)
        on_ready(settings.url)
        _watch(stop, on_note or (lambda line: None))
    except ServerFailed as exc:
        failed = exc.ray_failed
        raise
    finally:
        try:
            if state.connected.is_set() or starter.is_alive():
                global _UNFINISHED
                _UNFINISHED = not _stop_within(state, FAULT_STOP_S if failed else STOP_TIMEOUT_S)
        finally:
            state.release.set()
            if in_main:
                for s, h in old.items():
                    signal.signal(s, h)


class _Start:
    """The start of a server, run in a helper thread (:func:`serve_model` waits on its events)."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.connected = threading.Event()  # Ray initialised here
        self.proxy_up = threading.Event()  # Serve's HTTP proxy started
        self.done = threading.Event()
        self.release = threading.Event()  # the thread may end: Ray is shut down (or the process ends)
        self.started_here = False
        self.serve_started = False
        self.error: BaseException | None = None

    def run(self) -> None:
        from ray import serve

        from posfair.serve.application import app
        from posfair.serve.deployments import APP

        s = self.settings
        try:
            loopback = loopback_only(s.host, s.ray_address)
            try:
                self.started_here = connect(s.ray_address, proxy_env(s), loopback)
            except ServerFailed:
                raise
            except Exception as exc:  # noqa: BLE001 -- Ray's own start failing: said in one line
                raise ServerFailed(f"Ray could not start: {_one_line(exc)}{_limits_hint()}") from None
            self.connected.set()
            found = running_serve()
            self.serve_started = found is None
            conflict = serve_conflict(s.host, s.port, found)
            if conflict is not None:  # the command checked it before loading anything; a cluster may change since
                raise ServeConflict(conflict)
            try:
                serve.start(
                    proxy_location="HeadOnly",
                    http_options={"host": s.host, "port": s.port, "keep_alive_timeout_s": 5},
                )
                self.proxy_up.set()
                serve.run(app(s.args), name=APP, route_prefix="/")  # returns once the application runs
            except Exception as exc:  # noqa: BLE001 -- Serve's failures (RayTaskError, RuntimeError): one line
                raise ServerFailed(_deploy_failure(exc, s)) from None
        except BaseException as exc:  # noqa: BLE001 -- handed to the main thread
            self.error = exc
        finally:
            self.done.set()
        # Ray's processes die with the thread that started them (their parent-death signal is per thread): this
        # one lives as long as the server does
        self.release.wait()


def _answers(settings: ServerSettings) -> bool:
    """Whether the gateway answers at the server's address (any HTTP answer in OpenAI's shape or ours)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    try:
        with urllib.request.urlopen(_url(host, settings.port) + "/health", timeout=1) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
    except (OSError, ValueError):
        return False
    try:
        body = json.loads(raw)
    except ValueError:
        return False  # Serve's own "not found" while the application deploys
    return isinstance(body, dict) and ("error" in body or body.get("status") == "ok")


def _watch(stop: threading.Event, on_note: Callable[[str], None]) -> None:
    """Until ``stop``: every :data:`WATCH_PERIOD_S`, ask Ray's controller how the application is (in a helper
    thread, waited for at most :data:`RAY_ANSWER_S`).  A change of health is noted; Ray not answering twice in a
    row is a :class:`ServerFailed` (a killed raylet or GCS: the process then exits with one line, not hangs)."""
    from posfair.serve.deployments import APP

    last, silent = "RUNNING", 0
    while not stop.wait(WATCH_PERIOD_S):
        box: dict[str, Any] = {}

        def ask(box=box) -> None:
            from ray import serve

            try:
                app = serve.status().applications.get(APP)
                status = getattr(app.status, "value", app.status) if app is not None else "DELETED"
                box["status"] = (str(status), app.message if app is not None else "")
            except Exception as exc:  # noqa: BLE001 -- Ray not answering
                box["error"] = exc

        t = threading.Thread(target=ask, daemon=True, name="posfair-serve-watch")
        t.start()
        t.join(RAY_ANSWER_S)
        if "status" not in box:
            silent += 1
            if silent >= 2:
                why = _one_line(box["error"]) if "error" in box else f"no answer in {RAY_ANSWER_S:g} s"
                raise ServerFailed(
                    f"the server's Ray instance failed ({why}); the server cannot serve", ray_failed=True
                )
            continue
        silent = 0
        status, message = box["status"]
        if status != last:
            if status == "RUNNING":
                on_note("the model replicas are healthy again")
            elif status == "DELETED":
                raise ServerFailed("the server's application was deleted from Ray Serve (serve shutdown / delete)")
            else:
                on_note(f"the model replicas are not healthy ({status}): {_one_line(message) or 'Serve replaces them'}")
            last = status


def unfinished() -> bool:
    """Whether the last server's stop did not finish in time (Ray hung): the process should end with
    ``os._exit`` after its last line, as Ray's exit hooks would hang too."""
    return _UNFINISHED


def _stop_within(state: _Start, timeout: float) -> bool:
    """Drain the gateway, delete the application (a shared cluster) and shut Ray down (a local instance), in a
    helper thread, waited for at most ``timeout`` seconds: a Ray that died first (SIGTERM to the whole process
    group, as service managers send it) does not keep the process from ending."""
    t = threading.Thread(target=_stop_serving, args=(state,), daemon=True, name="posfair-serve-stop")
    t.start()
    t.join(timeout)
    if t.is_alive():
        logger.warning("Ray did not stop within %g s; the server ends without it", timeout)
        return False
    return True


def _stop_serving(state: _Start) -> None:
    """This server's application drained and deleted; Ray shut down when posfair started it, or else (a shared
    cluster) the Serve instance, when this server started it and no other application runs on it now."""
    import ray
    from ray import serve

    from posfair.serve.deployments import APP

    local = state.settings.ray_address in (None, "local")
    while not state.connected.is_set() and not state.done.is_set():  # Ray starting: stop it once started
        state.done.wait(0.1)
    if not state.connected.is_set():
        return
    try:
        if state.proxy_up.is_set():
            try:  # new requests get 503 "stopping" while those in flight finish
                serve.get_app_handle(APP).drain.remote(10.0).result(timeout_s=12)
            except Exception:  # noqa: BLE001 -- not deployed (yet), or Ray gone: nothing to drain
                pass
        if not state.started_here:
            serve.delete(APP)
            if state.serve_started and not local and not serve.status().applications:
                serve.shutdown()
    except Exception:  # noqa: BLE001 -- a Ray that failed: shut down below regardless
        logger.debug("stopping the application failed", exc_info=True)
    finally:
        if state.started_here:
            gc.collect()  # as posfair embed: Ray objects in reference cycles are collected while Ray is alive
            ray.shutdown()


def _one_line(exc: Any) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")


def _deploy_failure(exc: BaseException, settings: ServerSettings) -> str:
    """One line for a failed deployment: a port taken since the command checked it, or the replicas' own error."""
    text = str(exc)
    if "bind" in text.lower() and ("address already in use" in text.lower() or "failed to bind" in text.lower()):
        return f"--port {settings.port}: cannot listen on {settings.host}:{settings.port} (Address already in use)"
    return f"the server's application did not start: {_one_line(text)}"


def check_open_files(needed: int = 1024, wanted: int = 8192) -> None:
    """Raise this process's open-file limit towards ``wanted`` (as far as its hard limit allows: Ray's processes
    inherit it); :class:`ServerFailed` when it stays under ``needed`` -- Ray's raylet then crashes at start and
    the server would never come up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise ServerFailed(
            f"only {soft} open files are allowed (ulimit -n {soft}, hard limit {hard}); Ray needs {needed} or more "
            f"to start: raise the limit (ulimit -n {wanted})"
        )


def _limits_hint() -> str:
    """A word on the process limits that keep Ray from starting, where they are set low."""
    hints = []
    vmem = resource.getrlimit(resource.RLIMIT_AS)[0]
    if vmem != resource.RLIM_INFINITY:
        hints.append(f"a virtual memory limit of {vmem // 2**20} MiB is set (ulimit -v); Ray needs it unset")
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if files != resource.RLIM_INFINITY and files < 1024:
        hints.append(f"only {files} open files are allowed (ulimit -n); Ray needs 1024 or more")
    return f" ({'; '.join(hints)})" if hints else ""
