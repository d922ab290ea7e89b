"""The Ray Serve application of ``posfair serve``: the builder :func:`app` (``posfair.serve:app``) and its typed
arguments :class:`AppArgs`.

One application, composed as Serve composes them: ``Gateway.bind(Encoder.bind(...))`` (the gateway is given the
encoder's handle).  Everything that starts a posfair server starts this builder:

* ``posfair serve`` (checks its options, loads the model once to check it, then runs the builder's application);
* ``serve run posfair.serve:app model=bundled calibration=default`` (Serve's own command, arguments as
  ``key=value``);
* ``serve deploy config.yaml`` and KubeRay's RayService, whose config names ``import_path: posfair.serve:app``
  and the same arguments under ``args:``.

The API key is never an argument: ``api_key_env`` names the environment variable that holds it, read where the
builder runs; only its SHA-256 (:func:`posfair.serve.openai_api.key_digest`) is given to the gateway.
"""

# no "from __future__ import annotations": Serve reads the builder's argument type (AppArgs) at run time

import ipaddress
import os
import time
from typing import Annotated, Any

import ray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from posfair.calibration import Calibration
from posfair.distributed.ray_engine import cluster_nodes, plan_workers
from posfair.distributed.spec import EmbedSpec
from posfair.serve.deployments import Encoder, Gateway
from posfair.serve.openai_api import key_digest

__all__ = ["AppArgs", "app", "encoder_settings"]


class AppArgs(BaseModel):
    """The typed arguments of :func:`app` (``serve run posfair.serve:app KEY=VALUE ...``, or a config's ``args``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[str, Field(min_length=1)] = "bundled"
    """The model: ``bundled``, a hub id or a local folder (as ``--model``)."""
    name: str | None = None
    """The model name requests give (``model`` in a request); default: ``model``."""
    calibration: str | dict[str, Any] | None = None
    """``default``, ``stock`` or a spec ``B,LAYERS,STRENGTH[,VARIANT=VALUE]`` (as ``--calibration``), or a
    calibration's fields (``Calibration.to_dict``: what ``posfair serve`` gives); None: stock."""
    max_seq_length: Annotated[int, Field(ge=1)] | None = None
    pooling: str | None = None
    device: str | None = None
    trust_remote_code: bool = False
    replicas: Annotated[int, Field(ge=1)] = 1
    """Encoder replicas (Serve config's ``num_replicas`` / ``autoscaling_config`` for the deployment
    ``PosfairEncoder`` take precedence, as Serve applies a config over the code)."""
    replica_cpus: Annotated[float, Field(gt=0)] | None = None
    """CPUs each encoder replica holds (its torch threads); default: the most that let every replica run at once
    on the cluster's nodes, never more than its largest node holds (Serve config's ``ray_actor_options`` take
    precedence)."""
    max_batch_tokens: Annotated[int, Field(ge=1)] = 16384
    truncate: bool = False
    request_calibration: bool = False
    api_key_env: str | None = None
    """The environment variable holding the API key (unset: no key is asked)."""
    key_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    """The key's SHA-256 instead (``posfair serve`` gives this: the key then reaches no Ray process)."""
    cors_origins: tuple[str, ...] = ()
    """Web page origins allowed to call the API (``*``: any); none by default."""
    request_timeout_s: Annotated[float, Field(gt=0, le=86400)] = 600.0
    """The longest a request is served (408 past it)."""
    max_request_tokens: Annotated[int, Field(ge=1)] | None = None
    """The most tokens one request may hold (413 past it); None: no budget beyond 2048 texts."""
    fingerprint: str | None = None
    """The model's fingerprint as ``posfair serve`` checked it (replicas with other files refuse to start)."""
    max_queued_requests: Annotated[int, Field(ge=1, le=1000)] | None = None
    """The most API requests the gateway holds at once (503 with Retry-After past it); default: 128 per replica,
    at most 1000."""
    trusted_proxies: tuple[str, ...] = ()
    """Reverse proxies (addresses or networks) whose ``X-Forwarded-For`` names the client (its fair share of the
    replicas); none by default: a client is the address that connected.  ``posfair serve`` gives them to Serve's
    HTTP proxy (``POSFAIR_SERVE_TRUSTED_PROXIES``); under ``serve run`` or a RayService, set that variable (or
    uvicorn's ``FORWARDED_ALLOW_IPS``) where Ray starts: Serve's proxy reads it, not this argument."""

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            ipaddress.ip_network(address.strip(), strict=False)  # ValueError: pydantic names the argument
        return tuple(a.strip() for a in value)

    @field_validator("calibration")
    @classmethod
    def _a_spec(cls, value: Any) -> Any:
        _calibration_fields(value)  # ValueError: pydantic names the argument
        return value

    @property
    def served_name(self) -> str:
        return (self.name or self.model).strip()


def encoder_settings(
    args: AppArgs, nodes: dict[str, float] | list[dict[str, float]]
) -> tuple[dict[str, Any], dict[str, float]]:
    """The encoder replicas' constructor settings and Ray resources, for a cluster whose nodes hold ``nodes`` (each
    node's resources, as ``ray.nodes()`` gives them; one mapping: one node).  ``threads`` is the plan's: a replica
    takes its torch threads from the CPUs Ray actually gave it, where a Serve config set other resources."""
    plan = plan_workers(nodes, args.replicas, args.device, args.replica_cpus)
    spec = EmbedSpec(
        model=None if args.model.strip() == "bundled" else args.model,
        calibration=_calibration_fields(args.calibration),
        pooling=args.pooling,
        max_seq_length=args.max_seq_length,
        trust_remote_code=args.trust_remote_code,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
    )
    init = {
        "spec": spec.to_dict(),
        "fingerprint": args.fingerprint,
        "threads": plan.threads,
        "device": plan.device,
        "truncate": args.truncate,
        "request_calibration": args.request_calibration,
    }
    return init, plan.resources


def _calibration_fields(value: Any) -> dict[str, Any] | None:
    """The calibration's fields (None: stock) of the ``calibration`` argument."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "stock"):
        return None
    if isinstance(value, dict):
        return Calibration.from_dict(value).to_dict()
    return Calibration.parse(value).to_dict()


def _key_sha256(args: AppArgs) -> str | None:
    if args.key_sha256 is not None:
        return args.key_sha256
    if args.api_key_env is None:
        return None
    key = os.environ.get(args.api_key_env, "")
    if not key.strip():
        raise ValueError(f"api_key_env {args.api_key_env}: this environment variable is not set or empty")
    return key_digest(key.strip())


def app(args: AppArgs) -> Any:
    """The posfair server as one Serve application (see the module's description)."""
    if not isinstance(args, AppArgs):  # serve run passes the typed model; a caller may pass a dict
        args = AppArgs.model_validate(args)
    nodes = cluster_nodes(ray) if ray.is_initialized() else [{"CPU": float(os.cpu_count() or 1)}]
    init, actor = encoder_settings(args, nodes)
    encoder = Encoder.options(num_replicas=args.replicas, ray_actor_options=actor).bind(init)
    gateway = {
        "served_name": args.served_name,
        "key_sha256": _key_sha256(args),
        "created": int(time.time()),
        "cors_origins": list(args.cors_origins),
        "request_timeout_s": args.request_timeout_s,
        "max_request_tokens": args.max_request_tokens,
        "replicas": args.replicas,
        "max_queued_requests": args.max_queued_requests,
    }
    return Gateway.bind(encoder, gateway)
