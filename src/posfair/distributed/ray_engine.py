"""The Ray executor of :func:`~posfair.distributed.job.embed_texts`: a Ray Data actor pool of model replicas.

Ray is optional (the extra ``ray``: ``pip install -e '.[ray]'`` in a clone of posfair) and heavy: it is imported only when a
job runs on it (:func:`require_ray`); this module itself imports without it.

The shards go through ``ray.data.from_items(...).map_batches(ShardEncoder, ...)``
on an actor pool: one replica per GPU (``num_gpus=1`` each) or, without GPUs, one
per group of CPUs (torch threads = the CPUs it holds).  Each replica runs the very
shard function of the local executor and writes its shards straight into the
store, so the driver only collects one small status row per shard.

A job owns its actors from start to end.  Every replica registers its handle with
a zero-CPU registry actor, and when the job ends -- finished, failed, interrupted --
the driver kills them all and the registry: a failed run never leaves replicas
holding CPUs or GPUs that a second run in the same process would wait for.  When
posfair started (or connected to) Ray itself it also disconnects at the end, which
ends every actor of the job on the cluster as well.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import logging
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posfair.distributed.spec import EmbedSpec
from posfair.distributed.worker import Shard, process_shard
from posfair.runtime.errors import install_hint
from posfair.runtime.private_api import quiet_ray_start
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import ManifestMismatch

__all__ = [
    "RAY_INSTALL_HINT",
    "ShardEncoder",
    "WorkerPlan",
    "cluster_nodes",
    "held_threads",
    "plan_workers",
    "replica_cpus",
    "ray_available",
    "require_ray",
    "root_cause",
    "run_ray",
]

RAY_INSTALL_HINT = install_hint("ray")

# status rows two shards deep per replica: enough to keep it busy, little to lose when it dies
_IN_FLIGHT_PER_WORKER = 2
_CLEANUP_TIMEOUT_S = 30.0
_RELEASE_WAIT_S = 10.0


def ray_available() -> bool:
    """Whether Ray is installed (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def require_ray():
    """``ray`` with Ray Data importable, or an ImportError that says what to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError(f"running on Ray (--ray-address / --workers) needs Ray Data: {RAY_INSTALL_HINT}") from None
    return ray


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """How many replicas, what each holds, and how each runs torch."""

    workers: int
    resources: dict[str, float]  # Ray resource request per replica: {"num_cpus": .., "num_gpus": ..}
    threads: int | None  # torch threads per replica (None: torch's default)
    device: str | None  # device each replica loads the model on


NodeResources = Mapping[str, float]


def cluster_nodes(ray) -> list[dict[str, float]]:
    """The resources of each live node of the connected cluster (``ray.nodes()``: Ray's public node table)."""
    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def replica_cpus(node_cpus: Sequence[float], replicas: int) -> int:
    """The most CPUs each of ``replicas`` replicas can hold so that all of them fit the nodes at once: the largest
    ``c`` (at most the largest node's CPUs) with ``sum(floor(node / c)) >= replicas``; 1 when even one CPU each is
    more than the cluster holds (the replicas past its CPUs then wait for a node).  A replica never asks for more
    CPUs than one node holds: Ray could never place it."""
    whole = [int(c) for c in node_cpus if c >= 1]
    for c in range(max(whole, default=1), 1, -1):
        if sum(n // c for n in whole) >= replicas:
            return c
    return 1


def plan_workers(
    nodes: NodeResources | Sequence[NodeResources],
    workers: int | None,
    device: str | None,
    cpus_each: float | None = None,
) -> WorkerPlan:
    """The replica layout for a cluster whose nodes hold ``nodes`` (each as ``ray.nodes()``'s ``Resources``; one
    mapping: a cluster of one node).

    With GPUs: ``workers`` replicas (default one per GPU), each holding one GPU and one CPU, on ``cuda``.  Without:
    ``workers`` replicas (default one per CPU of the cluster), each holding ``cpus_each`` CPUs or, by default, the
    most CPUs that let all of them run at once on these nodes (:func:`replica_cpus`: never more than the largest
    node holds), torch threads = CPUs held, on ``device``.  ``device="cpu"`` forces CPU replicas on a GPU cluster.
    The replicas themselves take their torch threads from what Ray gave them (:func:`held_threads`), so a layout
    that Serve's config or Ray overrides is run with the CPUs actually held.
    """
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}")
    if cpus_each is not None and not cpus_each > 0:
        raise ValueError(f"the CPUs of a replica must be more than 0; got {cpus_each}")
    nodes = [nodes] if isinstance(nodes, Mapping) else list(nodes)
    gpus = int(sum(n.get("GPU", 0) for n in nodes))
    node_cpus = [float(n.get("CPU", 0)) for n in nodes] or [1.0]
    if gpus and device != "cpu":
        if device not in (None, "cuda") and not str(device).startswith("cuda"):
            raise ValueError(f"this Ray cluster has GPUs; device must be cuda or cpu, not {device!r}")
        return WorkerPlan(workers or gpus, {"num_gpus": 1, "num_cpus": cpus_each or 1}, None, "cuda")
    if device is not None and str(device).startswith("cuda"):
        raise ValueError(f"this Ray cluster has no GPUs; device {device!r} cannot be used (leave it unset or use cpu)")
    n = workers or max(1, int(sum(node_cpus)))
    per = cpus_each if cpus_each is not None else replica_cpus(node_cpus, n)
    return WorkerPlan(n, {"num_cpus": per}, max(1, int(per)), device)


def held_threads() -> int | None:
    """Torch threads for this Ray actor: the CPUs Ray assigned it (its runtime context; a fraction: 1), or None
    (torch's default) where it holds no CPU or runs outside Ray."""
    import ray

    if not ray.is_initialized():
        return None
    cpus = float(ray.get_runtime_context().get_assigned_resources().get("CPU", 0))
    return max(1, int(cpus)) if cpus > 0 else None


_REGISTRY_CLASS = None


def _registry_class(ray):
    """A zero-CPU actor holding the handles of a job's replicas (so the driver can kill them) and their refusals
    (a :class:`ManifestMismatch` raised in a replica's constructor reaches the driver as this record, not as text)."""
    global _REGISTRY_CLASS
    if _REGISTRY_CLASS is None:

        class Replicas:
            def __init__(self) -> None:
                self.handles: dict[str, Any] = {}
                self.refused: list[str] = []

            def add(self, actor_id: str, handle) -> None:
                self.handles[actor_id] = handle

            def all(self) -> list:
                return list(self.handles.values())

            def refuse(self, message: str) -> None:
                """A replica refused to write here (a settings error, not a crash): the driver raises it as such."""
                self.refused.append(message)

            def refusals(self) -> list[str]:
                return list(self.refused)

        _REGISTRY_CLASS = ray.remote(num_cpus=0, max_restarts=0)(Replicas)
    return _REGISTRY_CLASS


class ShardEncoder:
    """A model replica that processes shards: the Ray actor (a callable class for ``map_batches``).

    It first reports its own actor handle to the job's ``registry`` (so the driver
    can end it), then loads the model; its fingerprint must equal the driver's, so
    a worker with other weights or libraries cannot write here.  ``after_shard(result)``
    (optional) runs after each shard in the worker (monitoring, fault injection in tests).
    """

    def __init__(
        self,
        spec: dict,
        ns_dir: str,
        fingerprint: str,
        threads: int | None = None,
        device: str | None = None,
        after_shard: Callable[[dict], None] | None = None,
        registry=None,
    ):
        import ray

        if registry is not None:
            here = ray.get_runtime_context()
            ray.get(registry.add.remote(here.get_actor_id(), here.current_actor))
        threads = held_threads() or threads  # what Ray gave this actor; the plan's number outside Ray
        if threads:
            torch.set_num_threads(int(threads))
        self.spec = EmbedSpec.from_dict(spec)
        self.ns_dir = ns_dir
        self.after_shard = after_shard
        self.model = self.spec.load_model(device)
        if self.model.fingerprint != fingerprint:
            message = (
                f"worker model fingerprint {self.model.fingerprint} differs from the driver's {fingerprint}: "
                "install the same model files and library versions on every node"
            )
            if registry is not None:
                ray.get(registry.refuse.remote(message))
            raise ManifestMismatch(message)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = []
        for sid, keys, texts in zip(batch["shard"], batch["keys"], batch["texts"], strict=True):
            res = process_shard(
                self.model, self.spec, self.ns_dir, str(sid), [str(k) for k in keys], [str(t) for t in texts]
            )
            if self.after_shard is not None:
                self.after_shard(res)
            rows.append(res)
        return {k: np.array([r[k] for r in rows]) for k in rows[0]} if rows else {}


def _kill_job_actors(ray, registry, free_before: Mapping[str, float]) -> int:
    """Kill every replica the registry knows, then the registry; the number of replicas killed.

    ``ray.kill`` is asynchronous: the driver then waits (a few seconds at most) until
    the CPUs and GPUs free before the pool started are free again, so a next job in
    this process finds them (on a shared cluster another job may take them first).
    """
    try:
        handles = ray.get(registry.all.remote(), timeout=_CLEANUP_TIMEOUT_S)
    except Exception:  # noqa: BLE001 -- the registry is gone or unreachable: nothing more to do here
        handles = []
    for h in (*handles, registry):
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 -- already dead
            pass
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while time.monotonic() < deadline:
        now = ray.available_resources()
        if all(now.get(r, 0) >= free_before.get(r, 0) for r in ("CPU", "GPU")):
            break
        time.sleep(0.1)
    return len(handles)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _raised_in_worker(exc: BaseException) -> BaseException | None:
    """The worker's own exception under Ray's wrappers, found by type: a ``RayTaskError`` holds it as ``cause``
    (Ray Data wraps it once more in a ``UserCodeException`` whose ``__cause__`` it is); None when no exception
    outside Ray's own classes is attached (e.g. an actor whose constructor raised: Ray keeps only its text)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        ray_class = type(e).__module__.startswith("ray.")
        if not ray_class and not _is_ray_error(e):
            return e
        todo += [getattr(e, "cause", None), e.__cause__]
    return None


def _is_ray_error(e: BaseException) -> bool:
    """Ray's own exception, or a worker's exception re-raised as Ray's dual class (``RayTaskError(ValueError)``)."""
    return any(c.__module__.startswith("ray.") for c in type(e).__mro__ if c is not object and c is not type(e))


def root_cause(exc: BaseException) -> tuple[str, str]:
    """``(type name, message)`` of the exception raised in the worker under a Ray error.

    The worker's exception object, when Ray attached it (:func:`_raised_in_worker`).  Otherwise
    Ray's task errors carry the worker's traceback in their text only: the worker's own
    exception is the last ``Type: message`` line there that is not one of Ray's
    wrappers (``ray.exceptions.*``).  Wrappers without such text are followed
    through ``__cause__``; failing all that, the deepest exception itself.
    """
    found = _raised_in_worker(exc)
    if found is not None and found is not exc:
        text = _ANSI.sub("", str(found)).strip()
        return type(found).__name__, text.splitlines()[0] if text else ""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    for e in chain:
        text = _ANSI.sub("", str(e)).strip()
        for line in reversed(text.splitlines()):
            m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception|Mismatch|Interrupt|Exit)): (.*)$", line)
            if m and not m.group(1).startswith("ray."):
                return m.group(1).rsplit(".", 1)[-1], m.group(2)
    deepest = chain[-1]
    text = _ANSI.sub("", str(deepest)).strip()
    return type(deepest).__name__, text.splitlines()[0] if text else ""


def run_ray(
    spec: EmbedSpec,
    ns_dir: Path,
    shards: list[Shard],
    on_result: Callable[[dict], None],
    after_shard: Callable[[dict], None] | None,
    fingerprint: str,
    address: str | None,
    workers: int | None,
) -> int:
    """Run ``shards`` on a Ray Data actor pool; ``on_result`` gets each shard's status row. Returns the replicas used."""
    ray = require_ray()
    started_here = not ray.is_initialized()
    if started_here:
        with quiet_ray_start(off_main=False):
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        return _run_with_replacements(ray, spec, ns_dir, shards, on_result, after_shard, fingerprint, workers)
    finally:
        if started_here:
            # Ray's stream objects left in reference cycles call into the core worker when collected: collect
            # them while it is alive (after shutdown such a call crashes the process)
            gc.collect()
            ray.shutdown()  # ends this driver's job, and with it any actor it created


class WorkerLost(RuntimeError):
    """A replica's process died (killed, out of memory, a crashed node): its shard is not done, the others are."""


def _lost_worker(ray, exc: BaseException) -> str | None:
    """What Ray says about a replica whose process died, if that is what ``exc`` (or an exception under it)
    reports, by Ray's exception classes; ``None`` for anything else (an error raised by the shard function, a
    settings error)."""
    kinds = (
        ray.exceptions.RayActorError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.OutOfMemoryError,
        ray.exceptions.NodeDiedError,
    )
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        # an actor whose constructor raised (e.g. a fingerprint refusal) did not lose its process: not replaced
        if isinstance(e, kinds) and not getattr(e, "actor_init_failed", False):
            # Ray's first line, e.g. "The actor died unexpectedly before finishing this task."; not the lines of
            # details and common causes under it
            text = _ANSI.sub("", str(e)).strip()
            return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no message'}"
        todo += [e.__cause__, e.__context__]
    return None


#: how many times a job replaces its pool after a replica died before it stops (rerunning resumes it)
MAX_POOL_REPLACEMENTS = 3


def _run_with_replacements(ray, spec, ns_dir, shards, on_result, after_shard, fingerprint, workers) -> int:
    """Run the pool; when a replica dies, start a new pool on the shards not yet reported, up to
    :data:`MAX_POOL_REPLACEMENTS` times, each said in a warning.

    posfair replaces the pool itself instead of letting Ray restart actors (Ray Data's default,
    ``max_restarts=-1``): Ray restarts forever (a shard that kills every replica, e.g. out of
    memory, would never end) and its restartable actors print an error-level line on every run,
    successful or not.  A shard a dead replica wrote before dying is found complete on the next
    pool and counted as skipped, as on a rerun.
    """
    left = list(shards)
    replaced = 0
    reported: set[str] = set()  # every shard a pool of this job reported

    def collect(row: dict) -> None:
        reported.add(str(row["shard"]))
        on_result(row)

    while True:
        try:
            return _run_pool(ray, spec, ns_dir, left, collect, after_shard, fingerprint, workers)
        except WorkerLost as lost:
            left = [s for s in left if s.id not in reported]
            if replaced >= MAX_POOL_REPLACEMENTS:
                raise RuntimeError(
                    f"the Ray embedding job failed: replicas died {replaced + 1} times ({lost}); "
                    f"finished shards are kept, {len(left)} shards are left: rerun to resume"
                ) from None
            replaced += 1
            warnings.warn(
                f"a Ray replica died ({lost}); starting a new pool for the {len(left)} shards left "
                f"(replacement {replaced} of at most {MAX_POOL_REPLACEMENTS}); finished shards are kept",
                stacklevel=user_stacklevel(),
            )


def _run_pool(ray, spec, ns_dir, shards, on_result, after_shard, fingerprint, workers) -> int:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    plan = plan_workers(cluster_nodes(ray), workers, spec.device)
    free = ray.available_resources()
    short = {
        r: q * plan.workers
        for r, q in plan.resources.items()
        if free.get({"num_cpus": "CPU", "num_gpus": "GPU"}[r], 0) < q * plan.workers
    }
    if short:
        warnings.warn(
            f"Ray has {free.get('CPU', 0):g} CPUs / {free.get('GPU', 0):g} GPUs free for {plan.workers} workers "
            f"needing {short}: the job waits until they are free (another job may hold them)",
            stacklevel=user_stacklevel(),
        )
    registry = _registry_class(ray).remote()
    items = [{"shard": s.id, "keys": list(s.keys), "texts": list(s.texts)} for s in shards]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    out = ds.map_batches(
        ShardEncoder,
        fn_constructor_kwargs=dict(
            spec=spec.to_dict(),
            ns_dir=str(ns_dir),
            fingerprint=fingerprint,
            threads=plan.threads,
            device=plan.device,
            after_shard=after_shard,
            registry=registry,
        ),
        batch_size=1,
        batch_format="numpy",
        # a replica whose process dies is not restarted by Ray: the job starts a new pool (_run_with_replacements);
        # a named parameter of map_batches in newer Ray, one of its remote arguments before
        max_restarts=0,
        compute=ray.data.ActorPoolStrategy(size=plan.workers, max_tasks_in_flight_per_actor=_IN_FLIGHT_PER_WORKER),
        **plan.resources,
    )
    failure: BaseException | None = None
    refused: list[str] = []
    try:
        for row in out.iter_rows():
            on_result({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
    except Exception as exc:  # noqa: BLE001 -- re-raised below, without Ray's internals attached
        failure = exc
        refused = _refusals(ray, registry)
    finally:
        _kill_job_actors(ray, registry, free)  # also on KeyboardInterrupt
    if failure is not None:
        if refused:  # a replica refused to write here: a settings error, not a crash
            raise ManifestMismatch(refused[0])
        if isinstance(_raised_in_worker(failure), ManifestMismatch):  # one raised while a replica works, as such
            raise ManifestMismatch(str(_raised_in_worker(failure)))
        lost = _lost_worker(ray, failure)
        if lost is not None:
            raise WorkerLost(lost)
        kind, message = root_cause(failure)
        raise RuntimeError(
            f"the Ray embedding job failed; finished shards are kept, rerun to resume: {kind}: {message}"
        )
    return plan.workers


def _refusals(ray, registry) -> list[str]:
    """The refusals the job's replicas recorded (:meth:`ShardEncoder.__init__`); none when the registry is gone."""
    try:
        return ray.get(registry.refusals.remote(), timeout=_CLEANUP_TIMEOUT_S)
    except Exception:  # noqa: BLE001 -- the registry is unreachable: no refusal is known
        return []
