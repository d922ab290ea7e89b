"""Where ``posfair serve`` runs: a Ray instance of its own, or a running cluster it joins -- and what a Serve
instance already running there allows.

:func:`connect` starts a local Ray instance (on the loopback only when the server listens there:
:func:`loopback_only`, with Serve's HTTP proxy running posfair's guard: :func:`proxy_env`) or joins the cluster at
``--ray-address``.  On a running cluster :func:`cluster_conflict` says, before the command loads anything, why
posfair cannot serve there: a Serve instance already on the cluster keeps the address it started with (Serve
ignores a new one), may already run a posfair server (whose application this one would replace), or route ``/``
to another application.  Ray's start failing for a process limit (open files, virtual memory) is said with the
limit (:func:`check_open_files`).

The lifecycle of the server itself (start, serve, watch, stop) is :mod:`posfair.serve.runner`'s.
"""

from __future__ import annotations

import dataclasses
import gc
import ipaddress
import logging
import os
import resource
from typing import Any

from posfair.runtime.errors import install_hint
from posfair.runtime.private_api import RAY_LOCAL_ONLY_ENV, quiet_ray_start, serve_instance_details

__all__ = [
    "RAY_ANSWER_S",
    "SERVE_INSTALL_HINT",
    "RunningServe",
    "ServeConflict",
    "ServerFailed",
    "check_open_files",
    "cluster_conflict",
    "connect",
    "loopback_only",
    "one_line",
    "proxy_env",
    "running_serve",
    "serve_available",
    "serve_conflict",
    "start_ray",
    "url",
]

SERVE_INSTALL_HINT = install_hint("serve")
#: the longest the server waits for Ray's controller to answer (a status, the instance's details)
RAY_ANSWER_S = 10.0


def serve_available() -> bool:
    """Whether Ray Serve and its HTTP stack import (without starting anything)."""
    try:
        import fastapi  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError:
        return False
    return True


class ServerFailed(RuntimeError):
    """The server could not start, or Ray failed under it: one line saying why (``posfair serve`` exits 1).
    ``ray_failed``: Ray itself no longer answers (the stop then waits for it only briefly)."""

    def __init__(self, message: str, ray_failed: bool = False):
        super().__init__(message)
        self.ray_failed = ray_failed


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
            "call posfair.serve.cluster.loopback_only first), so its ports would listen on every interface"
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


def proxy_env(args: Any) -> dict[str, str]:
    """The environment a Ray instance of the server's own starts with, for the application's arguments ``args``
    (:class:`posfair.serve.application.AppArgs`): Serve's HTTP proxy runs posfair's guard
    (:func:`posfair.serve.proxy.guard`), which asks the key (its SHA-256 only) on Serve's own paths and believes
    ``X-Forwarded-For`` of the trusted proxies only."""
    from posfair.serve.proxy import CALLBACK_ENV, KEY_SHA256_ENV, TRUSTED_PROXIES_ENV

    env = {CALLBACK_ENV: "posfair.serve.proxy:guard"}
    if args.key_sha256:
        env[KEY_SHA256_ENV] = args.key_sha256
    if args.trusted_proxies:  # else none trusted, unless FORWARDED_ALLOW_IPS is set (proxy.trust_forwarded)
        env[TRUSTED_PROXIES_ENV] = ",".join(args.trusted_proxies)
    return env


def start_ray(host: str, address: str | None, args: Any) -> bool:
    """:func:`connect` for a server on ``host`` with Ray at ``address`` and the application's arguments ``args``: a
    local instance of its own on the loopback where :func:`loopback_only` says so, its HTTP proxy guarded
    (:func:`proxy_env`).  Ray's own start failing is a :class:`ServerFailed` of one line, with the process limit
    that keeps Ray from starting where one is set low.  Whether Ray was started (or joined) here."""
    loopback = loopback_only(host, address)
    try:
        return connect(address, proxy_env(args), loopback)
    except ServerFailed:
        raise
    except Exception as exc:  # noqa: BLE001 -- Ray's own start failing: said in one line
        raise ServerFailed(f"Ray could not start: {one_line(exc)}{_limits_hint()}") from None


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
        return url(self.host, self.port)


def url(host: str, port: int) -> str:
    """The HTTP address of ``host:port`` (an IPv6 host in brackets)."""
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
            f"{here}, not at {url(host, port)} (a Serve instance keeps the address it started with): pass --host "
            f"{found.host} --port {found.port} to serve there, or stop it (`serve shutdown`) first"
        )
    root = sorted(n for n, r in found.routes.items() if r == "/")
    if root:
        return f"{here}, and its application {root[0]!r} takes the route '/' this server needs"
    return None


def one_line(exc: Any) -> str:
    """The last non-empty line of an error's text (its type's name when it has none): what a one-line error says."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")


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
