"""``posfair serve``: start the application of :func:`posfair.serve.application.app`, serve, stop.

What ``serve run posfair.serve:app`` does (start Ray, start Serve's HTTP proxy, ``serve.run`` the application,
wait, shut down on Ctrl-C) is done here with Serve's own calls; :mod:`posfair.serve.cluster` says where (a Ray
instance of posfair's own, or a running cluster) and refuses a cluster it cannot serve on.  What
:func:`serve_model` adds to ``serve run`` is what a server run by a service manager needs:

* **one line for every failure**, never a traceback (:class:`ServerFailed`; ``posfair serve`` exits 1 with it);
* **signals in every state**: every Ray call that can wait runs in a helper thread, so SIGINT and SIGTERM are
  honoured while Ray starts, while the model loads, while serving and after a fault;
* **when it answers**: ``on_listening(url)`` once the gateway answers at the address (503 while the model
  replicas load), ``on_ready(url)`` once the application runs;
* **health notes**: Ray's controller is asked how the application is every :data:`WATCH_PERIOD_S`; a change is
  noted (``on_note``), Ray not answering twice in a row (a killed raylet or GCS) ends the server with a
  :class:`ServerFailed` instead of a process that neither serves nor exits;
* **a drained, bounded stop**: the gateway drains (new requests 503 "stopping", those in flight finish), then Ray
  is shut down when posfair started it (the instance and every process of it end with the command), or on a
  running cluster the application is deleted (and the Serve instance it started, if no other application runs
  on it); the whole stop takes at most :data:`STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from posfair.serve.cluster import (
    RAY_ANSWER_S,
    SERVE_INSTALL_HINT,
    ServeConflict,
    ServerFailed,
    check_open_files,
    one_line,
    running_serve,
    serve_available,
    serve_conflict,
    start_ray,
    url,
)

logger = logging.getLogger("posfair.serve")

__all__ = [
    "SERVE_INSTALL_HINT",
    "STOP_TIMEOUT_S",
    "ServeConflict",
    "ServerFailed",
    "ServerSettings",
    "check_open_files",
    "serve_available",
    "serve_model",
    "unfinished",
]


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
        return url(self.host, self.port)

    @property
    def served_name(self) -> str:
        return self.args.served_name


#: the longest a stop takes (draining the gateway, then Ray's shutdown) before the process ends regardless
STOP_TIMEOUT_S = 25.0
#: the longest a start may take (Ray, the HTTP proxy, the model replicas loading) before the server gives up
START_TIMEOUT_S = 900.0
#: ... after Ray failed under the server
FAULT_STOP_S = 5.0
_UNFINISHED = False
#: how often the running server asks Ray's controller how its application is
WATCH_PERIOD_S = 2.0


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
            self.started_here = start_ray(s.host, s.ray_address, s.args)
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
        with urllib.request.urlopen(url(host, settings.port) + "/health", timeout=1) as r:
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
                why = one_line(box["error"]) if "error" in box else f"no answer in {RAY_ANSWER_S:g} s"
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
                on_note(f"the model replicas are not healthy ({status}): {one_line(message) or 'Serve replaces them'}")
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


def _deploy_failure(exc: BaseException, settings: ServerSettings) -> str:
    """One line for a failed deployment: a port taken since the command checked it, or the replicas' own error."""
    text = str(exc)
    if "bind" in text.lower() and ("address already in use" in text.lower() or "failed to bind" in text.lower()):
        return f"--port {settings.port}: cannot listen on {settings.host}:{settings.port} (Address already in use)"
    return f"the server's application did not start: {one_line(text)}"
