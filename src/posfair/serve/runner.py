"""Start, run and stop a ``posfair serve`` server on Ray Serve.

:func:`serve_model` starts (or connects to) Ray, starts Serve's HTTP proxy on ``host:port``, deploys
the gateway application (no model: it runs within seconds) and calls ``on_listening(url)``, then
deploys the encoder application (``replicas`` model replicas, laid out by
:func:`posfair.distributed.ray_engine.plan_workers`) -- meanwhile the gateway answers 503 -- calls
``on_ready(url)`` once it runs, and serves until ``stop`` is set or the process gets SIGINT /
SIGTERM.  On the way out it deletes its applications; when it started Ray itself it shuts Ray down
(the instance and every process of it end with the command), and on a running cluster it shuts
down the Serve instance it started there if no other application runs on it.

On a running cluster (``--ray-address``), :func:`connect` joins it and :func:`serve_conflict` says
why posfair cannot serve there -- before the command loads anything: a Serve instance already on the
cluster keeps the address it started with (Serve ignores a new one), may already run a posfair server
(whose applications this one would replace), or route ``/`` to another application.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from posfair.distributed.ray_engine import _quiet_auth_notice, plan_workers
from posfair.distributed.spec import EmbedSpec
from posfair.errors import install_hint

__all__ = [
    "SERVE_INSTALL_HINT",
    "RunningServe",
    "ServeConflict",
    "ServerSettings",
    "cluster_conflict",
    "connect",
    "running_serve",
    "serve_available",
    "serve_conflict",
    "serve_model",
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
    """Everything a server runs with (checked by the command before it starts)."""

    spec: EmbedSpec  # the model, its loading options, the server's calibration, the token budget (max_tokens)
    served_name: str
    fingerprint: str
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    ray_address: str | None = None
    truncate: bool = False
    request_calibration: bool = False
    key_sha256: str | None = None

    @property
    def url(self) -> str:
        return _url(self.host, self.port)


class _Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C does not cut the shutdown short
        signal.signal(s, signal.SIG_IGN)
    raise _Stop


class ServeConflict(RuntimeError):
    """The cluster's running Serve instance and this server cannot go together (see :func:`serve_conflict`)."""


def connect(address: str | None) -> bool:
    """Start a local Ray instance (``address`` None or ``local``) or join the cluster at ``address``, unless this
    process is in one already (then False); Serve's INFO lines are hidden unless posfair logs at DEBUG."""
    import ray

    if not logging.getLogger("posfair").isEnabledFor(logging.DEBUG):
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if ray.is_initialized():
        return False
    with _quiet_auth_notice():
        ray.init(
            address=None if address in (None, "local") else address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    return True


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
    """The Serve instance already running on the connected cluster, or None."""
    from ray.serve.context import _get_global_client  # Serve's one way to find a running controller
    from ray.serve.schema import ServeInstanceDetails

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    details = ServeInstanceDetails(**client.get_serve_details())
    http = client.http_config
    return RunningServe(http.host, int(http.port), {n: a.route_prefix for n, a in details.applications.items()})


def serve_conflict(host: str, port: int, found: RunningServe | None) -> str | None:
    """Why this server cannot run beside the Serve instance ``found`` on the cluster (None: it can).

    A Serve instance keeps the host and port it started with (Serve ignores new ones), so this server joins
    it only where it listens already; it never replaces another posfair server's applications, nor takes
    route ``/`` from another application."""
    import posfair.serve.deployments as d

    if found is None:
        return None
    here = f"Ray Serve already runs on this cluster, listening at {found.url}"
    ours = sorted(set(found.routes) & {d.GATEWAY_APP, d.ENCODER_APP})
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
) -> None:
    """Serve until ``stop`` is set or SIGINT / SIGTERM arrives (see the module's description): ``on_listening(url)``
    once the gateway answers (503 while the model loads), ``on_ready(url)`` once the model replicas run."""
    import ray

    import posfair.serve.deployments as d

    local = settings.ray_address in (None, "local")
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = threading.current_thread() is threading.main_thread()
    try:
        started_here = connect(settings.ray_address)  # a local instance ends with it, a cluster connection closes
        # after ray.init, whose own SIGTERM handler (a stack dump, then the process ends) they replace
        if in_main:
            for s in old:
                signal.signal(s, _raise_stop)
        serve_started = False
        try:
            found = running_serve()
            serve_started = found is None
            conflict = serve_conflict(settings.host, settings.port, found)
            if conflict is not None:  # the command checked it before loading anything; a cluster may change since
                raise ServeConflict(conflict)
            _deploy(ray, d, settings, on_listening or (lambda url: None))
            on_ready(settings.url)
            while stop is None or not stop.is_set():
                time.sleep(0.2)
        finally:
            _stop_serving(ray, d, started_here, serve_started and not local)
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        if in_main:
            for s, h in old.items():
                signal.signal(s, h)


def encoder_settings(settings: ServerSettings, resources: dict[str, float]) -> tuple[dict[str, Any], dict[str, float]]:
    """The encoder replicas' constructor settings and Ray resources, for a cluster with ``resources``."""
    plan = plan_workers(resources, settings.replicas, settings.spec.device)
    init = {
        "spec": settings.spec.to_dict(),
        "fingerprint": settings.fingerprint,
        "threads": plan.threads,
        "device": plan.device,
        "truncate": settings.truncate,
        "request_calibration": settings.request_calibration,
    }
    return init, plan.resources


def _deploy(ray, d, settings: ServerSettings, on_listening: Callable[[str], None]) -> None:
    """The gateway deployed and running (it answers 503 until the encoder runs), ``on_listening``; then the encoder
    application started (its replicas load the model) and waited for."""
    from ray import serve

    serve.start(http_options={"host": settings.host, "port": settings.port, "location": "HeadOnly"})
    gateway = d.Gateway.bind(settings.served_name, settings.key_sha256, int(time.time()))
    serve.run(gateway, name=d.GATEWAY_APP, route_prefix="/", blocking=False)  # returns once it runs
    on_listening(settings.url)
    init, resources = encoder_settings(settings, ray.cluster_resources())
    encoder = d.Encoder.options(num_replicas=settings.replicas, ray_actor_options=resources).bind(init)
    serve._run(encoder, _blocking=False, name=d.ENCODER_APP, route_prefix=None)
    while True:
        app = serve.status().applications.get(d.ENCODER_APP)
        if app is not None and app.status == "RUNNING":
            return
        if app is not None and app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"the model replicas did not start: {app.message}")
        time.sleep(0.2)


def _stop_serving(ray, d, started_here: bool, shared_serve_started: bool) -> None:
    """This server's applications deleted; Ray shut down when posfair started it, or else (a shared cluster) the
    Serve instance, when this server started it and no other application runs on it now."""
    from ray import serve

    try:
        # drained, the gateway first: no new request reaches a replica being stopped
        for app in (d.GATEWAY_APP, d.ENCODER_APP):
            serve.delete(app)
        if shared_serve_started and not serve.status().applications:
            serve.shutdown()
    finally:
        if started_here:
            gc.collect()  # as posfair embed: Ray objects in reference cycles are collected while Ray is alive
            ray.shutdown()
