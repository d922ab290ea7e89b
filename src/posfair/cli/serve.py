"""``posfair serve``: the OpenAI embeddings API and late chunking over HTTP, stock or calibrated, on Ray Serve."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import typer

from posfair.cli import checks
from posfair.cli.options import (
    BasketSize,
    CalibrationLayers,
    CalibrationOption,
    Device,
    MaxBatchTokens,
    MaxSeqLength,
    Model,
    Pooling,
    Strength,
    TrustRemoteCode,
)
from posfair.cli.parsers import integer, number
from posfair.cli.terminal import say

Host = Annotated[
    str, typer.Option("--host", metavar="ADDRESS", help="Address to listen on (127.0.0.1: this machine only).")
]
Port = Annotated[int, typer.Option("--port", parser=integer(1, 65535), metavar="PORT", help="Port to listen on.")]
Replicas = Annotated[
    int,
    typer.Option(
        "--replicas",
        parser=integer(1),
        metavar="N",
        help="Model replicas (each its share of the CPUs, or one GPU).",
    ),
]
ReplicaCpus = Annotated[
    float | None,
    typer.Option(
        "--replica-cpus",
        parser=number(0, 1024, low_open=True),
        metavar="N",
        show_default="the most that let every replica run at once, at most one node's CPUs",
        help="CPUs each model replica holds (its torch threads).",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        show_default="a local Ray instance of its own",
        help=(
            "Serve on a running Ray cluster: 'auto' or 'ray://host:port'. A Ray Serve instance already running "
            "there keeps the address it started with, so posfair serves there only at that --host/--port, "
            "beside no other posfair server and no application on route '/'; otherwise it refuses (exit 2) "
            "before loading anything, naming the instance's address."
        ),
    ),
]
ApiKeyEnv = Annotated[
    str | None,
    typer.Option(
        "--api-key-env",
        metavar="VAR",
        help="Require 'Authorization: Bearer KEY', KEY being the value of this environment variable.",
    ),
]
Truncate = Annotated[
    bool,
    typer.Option(
        "--truncate",
        help="Truncate texts over the token limit (the X-Posfair-Truncated header counts them) instead of refusing them.",
    ),
]
CorsOrigin = Annotated[
    list[str] | None,
    typer.Option(
        "--cors-origin",
        metavar="ORIGIN",
        show_default="none: web pages cannot call the server",
        help="A web page origin (e.g. https://app.example.org) allowed to call the API from a browser; repeat for "
        "more, '*' for any.",
    ),
]
RequestTimeout = Annotated[
    float,
    typer.Option(
        "--request-timeout",
        parser=number(0.001, 86400),
        metavar="SECONDS",
        help="The longest one request is served; past it the answer is 408 in OpenAI's error shape.",
    ),
]
MaxRequestTokens = Annotated[
    int | None,
    typer.Option(
        "--max-request-tokens",
        parser=integer(1),
        metavar="TOKENS",
        show_default="no budget beyond 2048 texts",
        help="The most tokens one request may hold (prompt and special tokens included); past it the answer is 413 "
        "in OpenAI's error shape.",
    ),
]
MaxQueuedRequests = Annotated[
    int | None,
    typer.Option(
        "--max-queued-requests",
        parser=integer(1, 1000),
        metavar="N",
        show_default="128 per replica, at most 1000",
        help="The most API requests the server holds at once (reading, waiting or encoded); past it the answer is "
        "503 with Retry-After in OpenAI's error shape, at once.",
    ),
]


def _proxy_address(value: str) -> str:
    """An IP address or network (``10.0.0.0/8``) of a reverse proxy."""
    import ipaddress

    try:
        ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        raise typer.BadParameter(
            f"must be an IP address or network (e.g. 10.0.0.5, 10.0.0.0/8); got {value!r}"
        ) from None
    return str(value).strip()


TrustedProxy = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-proxy",
        parser=_proxy_address,
        metavar="ADDRESS",
        show_default="none: a client is the address that connected",
        help="A reverse proxy (IP address or network) whose X-Forwarded-For header names the client, each client "
        "taking its own turns on the replicas; repeat for more.",
    ),
]
RequestCalibration = Annotated[
    bool,
    typer.Option(
        "--request-calibration",
        help="Let a request choose its calibration ('stock', 'default', a spec or a label; never a prior file).",
    ),
]


def serve(
    model: Model = None,
    calibration: CalibrationOption = None,
    basket_size: BasketSize = None,
    layers: CalibrationLayers = None,
    strength: Strength = None,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    replicas: Replicas = 1,
    replica_cpus: ReplicaCpus = None,
    ray_address: RayAddress = None,
    max_batch_tokens: MaxBatchTokens = 16384,
    api_key_env: ApiKeyEnv = None,
    truncate: Truncate = False,
    request_calibration: RequestCalibration = False,
    max_seq_length: MaxSeqLength = None,
    pooling: Pooling = None,
    device: Device = None,
    trust_remote_code: TrustRemoteCode = False,
    cors_origin: CorsOrigin = None,
    request_timeout: RequestTimeout = 600.0,
    max_request_tokens: MaxRequestTokens = None,
    max_queued_requests: MaxQueuedRequests = None,
    trusted_proxy: TrustedProxy = None,
) -> None:
    """Serve embeddings over HTTP (OpenAI's /v1/embeddings, late chunking at /v1/segments) until Ctrl-C."""
    from posfair.calibration import MODEL_DEFAULT, STOCK
    from posfair.serve.cluster import loopback_only

    loopback_only(host, ray_address)  # --host 127.0.0.1: Ray's own ports on the loopback too (set before Ray loads)
    key = _check_key_and_port(api_key_env, ray_address, host, port)
    cal = checks.calibration(calibration, basket_size, layers, strength)
    model_options = checks.ModelOptions(
        model, max_seq_length=max_seq_length, pooling=pooling, trust_remote_code=trust_remote_code, device=device
    ).checked()
    if ray_address is not None and ray_address != "local":
        _check_cluster(ray_address, host, port)
    # the model is loaded here once (on the CPU): its layers, pooling and token limit are checked before Ray starts
    fm = checks.load_model(model_options, device="cpu")
    checks.check_calibrations(fm, [cal])
    saved = fm.resolve_calibration(MODEL_DEFAULT)
    if cal is STOCK and saved is not STOCK:  # as every command: stock unless --calibration (posfair encode -m FOLDER)
        say(
            f"note: the model folder was saved with calibration {saved.label()}; without --calibration this server "
            f"encodes stock, as posfair encode does (pass --calibration {saved.spec()} to serve that calibration)",
            err=True,
        )
    from posfair.serve.application import AppArgs
    from posfair.serve.openai_api import key_digest
    from posfair.serve.runner import ServerSettings

    args = AppArgs(  # the typed arguments every way of starting a posfair server gives the application
        model=model_options.source or model_options.name,
        name=model_options.name,
        calibration=None if cal is STOCK else cal.to_dict(),
        max_seq_length=model_options.max_seq_length,
        pooling=model_options.pooling,
        device=model_options.device,
        trust_remote_code=model_options.trust_remote_code,
        replicas=replicas,
        replica_cpus=replica_cpus,
        max_batch_tokens=max_batch_tokens,
        truncate=truncate,
        request_calibration=request_calibration,
        key_sha256=key_digest(key.strip()) if key else None,
        cors_origins=tuple(cors_origin or ()),
        request_timeout_s=request_timeout,
        max_request_tokens=max_request_tokens,
        max_queued_requests=max_queued_requests,
        trusted_proxies=tuple(trusted_proxy or ()),
        fingerprint=fm.fingerprint,
    )
    if api_key_env is not None:  # read: kept out of the environment every Ray process of this server inherits
        os.environ.pop(api_key_env, None)
    setting = "stock" if cal is STOCK else cal.label()  # the setting's one name, as every output names it
    limit = int(fm.max_seq_length)
    del fm  # the replicas load their own
    _serve(ServerSettings(args=args, host=host, port=port, ray_address=ray_address), setting, limit)


def _check_key_and_port(api_key_env: str | None, ray_address: str | None, host: str, port: int) -> str | None:
    """Ray Serve is installed, ``--api-key-env`` names a set variable and, on a local Ray instance, ``--port`` is
    free at ``--host`` (before anything is loaded); the API key (None without ``--api-key-env``)."""
    from posfair.cli.error_boundary import PosfairInputError, input_error
    from posfair.serve.cluster import SERVE_INSTALL_HINT, serve_available

    if not serve_available():
        raise PosfairInputError(f"posfair serve runs on Ray Serve, which is not installed: {SERVE_INSTALL_HINT}")
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env, "")
        if not key.strip():
            raise input_error("--api-key-env", api_key_env, "this environment variable is not set or empty")
    if ray_address is None or ray_address == "local":
        _check_port(host, port)
        _check_open_files()
    return key


def _check_open_files() -> None:
    """The open-file limit Ray needs to start (raised as far as the hard limit allows), before anything loads."""
    from posfair.cli.terminal import error
    from posfair.serve.cluster import ServerFailed, check_open_files

    try:
        check_open_files()
    except ServerFailed as exc:
        error(str(exc))
        raise typer.Exit(1) from None


def _serve(settings, setting: str, limit: int) -> None:
    """Start the server with the checked ``settings`` (a :class:`posfair.serve.runner.ServerSettings`: where it
    listens and the application's typed arguments) and serve until stopped; ``setting`` (its one name) and
    ``limit`` (the model's token limit) are said in the first line."""
    from posfair.cli.error_boundary import input_error
    from posfair.serve import runner

    address = settings.ray_address
    where = "a local Ray instance" if address in (None, "local") else f"Ray at {address}"
    say(f"starting: {settings.served_name} ({setting}, {limit} tokens), {settings.args.replicas} replica(s) on {where}")

    def listening(url: str) -> None:
        say(f"listening on {url}; loading the model (GET /health and the API answer 503 until it is ready)")

    def ready(url: str) -> None:
        say(
            f"serving {settings.served_name} at {url} (POST /v1/embeddings, POST /v1/segments, GET /v1/models, "
            "GET /health); Ctrl-C stops it"
        )

    def note(line: str) -> None:
        say(f"note: {line}", err=True)

    try:
        runner.serve_model(settings, ready, on_listening=listening, on_note=note)
    except runner.ServeConflict as exc:  # the cluster changed since the command checked it
        raise input_error("--ray-address", address, str(exc)) from None
    except runner.ServerFailed as exc:
        message = str(exc)
        if message.startswith("--port "):  # taken since the command checked it: said as the check says it
            _end(2, f"error: --port {settings.port}: {message.partition(': ')[2]}")
        _end(1, f"error: {message}")
    _end(0, "stopped")


def _end(code: int, line: str) -> None:
    """The command's last line, then its exit: ``os._exit`` when Ray did not stop in time (its exit hooks would
    hang the process too), else as usual."""
    import sys

    from posfair.serve import runner

    say(line, err=bool(code))
    if runner.unfinished():
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)


def _check_cluster(address: str, host: str, port: int) -> None:
    """A Ray cluster answers at ``--ray-address`` and a server on ``--host``/``--port`` can run beside what Ray
    Serve runs there already (:func:`posfair.serve.cluster.serve_conflict`), before anything is loaded."""
    from posfair.cli.error_boundary import input_error
    from posfair.serve.cluster import cluster_conflict

    try:
        conflict = cluster_conflict(address, host, port)
    except (ConnectionError, ValueError) as exc:  # none running there; an address Ray cannot read
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise input_error(
            "--ray-address",
            address,
            f"cannot join a Ray cluster there ({why}; with token authentication, set "
            "RAY_AUTH_MODE=token and its token as for Ray's own commands)",
        ) from None
    if conflict is not None:
        raise input_error("--ray-address", address, conflict)


def _check_port(host: str, port: int) -> None:
    """``--host`` resolves and ``--port`` is free there (before anything is loaded)."""
    from posfair.cli.error_boundary import input_error

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise input_error("--host", host, f"not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(address)
        except OSError as exc:
            raise input_error("--port", port, f"cannot listen on {host}:{port} ({exc.strerror})") from None
