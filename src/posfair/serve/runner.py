"""Start, run and stop a ``posfair serve`` server on Ray Serve.

:func:`serve_model` starts (or connects to) Ray, starts Serve's HTTP proxy on ``host:port``, deploys
the gateway application, then the encoder application (``replicas`` model replicas, laid out by
:func:`posfair.distributed.ray_engine.plan_workers`), calls ``on_ready(url)`` once both run, and
serves until ``stop`` is set or the process gets SIGINT / SIGTERM.  On the way out it deletes its
applications and shuts Serve down, and when it started Ray itself, shuts Ray down: the instance
and every process of it end with the command.
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

__all__ = ["SERVE_INSTALL_HINT", "ServerSettings", "serve_available", "serve_model"]

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
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _Stop(Exception):
    pass


def _raise_stop(signum, frame) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C does not cut the shutdown short
        signal.signal(s, signal.SIG_IGN)
    raise _Stop


def serve_model(settings: ServerSettings, on_ready: Callable[[str], None], stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGINT / SIGTERM arrives (see the module's description)."""
    import ray

    import posfair.serve.deployments as d

    started_here = not ray.is_initialized()
    if not logging.getLogger("posfair").isEnabledFor(logging.DEBUG):  # Serve's INFO lines only with --debug
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = threading.current_thread() is threading.main_thread()
    try:
        if started_here:
            with _quiet_auth_notice():
                ray.init(
                    address=None if settings.ray_address in (None, "local") else settings.ray_address,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
        # after ray.init, whose own SIGTERM handler (a stack dump, then the process ends) they replace
        if in_main:
            for s in old:
                signal.signal(s, _raise_stop)
        try:
            _deploy(ray, d, settings)
            on_ready(settings.url)
            while stop is None or not stop.is_set():
                time.sleep(0.2)
        finally:
            _stop_serving(ray, d, started_here)
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


def _deploy(ray, d, settings: ServerSettings) -> None:
    """The encoder application started (its replicas load the model), the gateway deployed meanwhile (it answers
    503 until the encoder runs), then the wait for the encoder."""
    from ray import serve

    serve.start(http_options={"host": settings.host, "port": settings.port, "location": "HeadOnly"})
    init, resources = encoder_settings(settings, ray.cluster_resources())
    encoder = d.Encoder.options(num_replicas=settings.replicas, ray_actor_options=resources).bind(init)
    serve._run(encoder, _blocking=False, name=d.ENCODER_APP, route_prefix=None)
    gateway = d.Gateway.bind(settings.served_name, settings.key_sha256, int(time.time()))
    serve.run(gateway, name=d.GATEWAY_APP, route_prefix="/", blocking=False)
    while True:
        app = serve.status().applications.get(d.ENCODER_APP)
        if app is not None and app.status == "RUNNING":
            return
        if app is not None and app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"the model replicas did not start: {app.message}")
        time.sleep(0.2)


def _stop_serving(ray, d, started_here: bool) -> None:
    from ray import serve

    try:
        # this server's applications, drained (the gateway first: no new request reaches a replica being stopped);
        # Serve's controller and proxy end with Ray when posfair started it, or stay for others on a shared cluster
        for app in (d.GATEWAY_APP, d.ENCODER_APP):
            serve.delete(app)
    finally:
        if started_here:
            gc.collect()  # as posfair embed: Ray objects in reference cycles are collected while Ray is alive
            ray.shutdown()
