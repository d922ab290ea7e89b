"""The Ray executor's pure parts (no Ray needed): replica layout per cluster, root cause of a worker error."""

from __future__ import annotations

import pytest

from posfair.distributed.ray_engine import WorkerPlan, plan_workers, replica_cpus, root_cause


def test_one_replica_per_gpu_by_default():
    # 4 GPUs, 32 CPUs: 4 replicas, each one GPU + one CPU, on cuda (torch picks its threads)
    assert plan_workers({"GPU": 4.0, "CPU": 32.0}, None, None) == WorkerPlan(
        4, {"num_gpus": 1, "num_cpus": 1}, None, "cuda"
    )
    # fewer replicas than GPUs on request; an explicit cuda device is accepted
    assert plan_workers({"GPU": 4.0, "CPU": 32.0}, 2, "cuda:0") == WorkerPlan(
        2, {"num_gpus": 1, "num_cpus": 1}, None, "cuda"
    )


def test_cpu_replicas_split_the_cpus():
    assert plan_workers({"CPU": 2.0}, None, None) == WorkerPlan(2, {"num_cpus": 1}, 1, None)
    assert plan_workers({"CPU": 16.0}, 4, None) == WorkerPlan(4, {"num_cpus": 4}, 4, None)
    assert plan_workers({"CPU": 16.0}, 5, "cpu") == WorkerPlan(5, {"num_cpus": 3}, 3, "cpu")  # 16 // 5
    # more replicas than CPUs: each still asks for one (Ray queues the rest)
    assert plan_workers({"CPU": 2.0}, 3, None) == WorkerPlan(3, {"num_cpus": 1}, 1, None)
    # device="cpu" keeps the replicas off the GPUs of a GPU cluster
    assert plan_workers({"GPU": 2.0, "CPU": 8.0}, 4, "cpu") == WorkerPlan(4, {"num_cpus": 2}, 2, "cpu")


def test_replicas_fit_the_nodes_not_the_clusters_total():
    """Sized per node: no replica asks for more CPUs than one node holds, and every replica fits at once."""
    one_each = [{"CPU": 1.0}, {"CPU": 1.0}]
    assert plan_workers(one_each, 1, None) == WorkerPlan(1, {"num_cpus": 1}, 1, None)  # not the cluster's 2
    assert plan_workers(one_each, 2, None) == WorkerPlan(2, {"num_cpus": 1}, 1, None)
    assert plan_workers(one_each, None, None).workers == 2  # posfair embed: one per CPU of the cluster
    # 4 + 2 CPUs, 2 replicas: 3 each fits only once (6 // 2 = 3 is what the total would give); 2 each fits both
    assert plan_workers([{"CPU": 4.0}, {"CPU": 2.0}], 2, None).resources == {"num_cpus": 2}
    assert plan_workers([{"CPU": 8.0}, {"CPU": 2.0}], 1, None).resources == {"num_cpus": 8}
    assert plan_workers([{"CPU": 0.0}, {"CPU": 4.0}], 1, None).resources == {"num_cpus": 4}  # a CPU-less head
    # asked for: taken as given (an autoscaling cluster may add the node that holds it)
    assert plan_workers(one_each, 2, None, cpus_each=0.5) == WorkerPlan(2, {"num_cpus": 0.5}, 1, None)
    # GPUs counted over the nodes: one per replica
    gpus = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]
    assert plan_workers(gpus, None, None) == WorkerPlan(2, {"num_gpus": 1, "num_cpus": 1}, None, "cuda")


@pytest.mark.parametrize(
    ("nodes", "replicas"),
    [([1, 1], 1), ([1, 1], 2), ([4, 2], 2), ([4, 2], 3), ([16, 8, 8], 4), ([3, 3, 3], 4), ([2], 5), ([7, 5], 1)],
)
def test_replica_cpus_is_the_largest_that_fits(nodes, replicas):
    """Against a slow path: every size tried, the largest with all replicas placed by first fit."""

    def fits(c: int) -> bool:
        free, placed = list(nodes), 0
        for i in range(len(free)):
            while free[i] >= c and placed < replicas:
                free[i] -= c
                placed += 1
        return placed == replicas

    best = max((c for c in range(1, max(nodes) + 1) if fits(c)), default=1)
    assert replica_cpus(nodes, replicas) == best


def test_bad_worker_settings_are_named():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        plan_workers({"CPU": 2.0}, 0, None)
    with pytest.raises(ValueError, match="device must be cuda or cpu, not 'mps'"):
        plan_workers({"GPU": 1.0, "CPU": 2.0}, None, "mps")
    with pytest.raises(ValueError, match="has no GPUs; device 'cuda' cannot be used"):
        plan_workers({"CPU": 8.0}, 2, "cuda")


def test_root_cause_of_a_wrapped_worker_error():
    wrapped = RuntimeError(
        "The actor died because of an error raised in its creation task, \x1b[36mray::MapWorker(MapBatches(X)).__init__()"
        "\x1b[39m (pid=1, ip=1.2.3.4)\n"
        '  File "job.py", line 268, in __init__\n    raise ManifestMismatch(\n'
        "posfair.distributed.job.ManifestMismatch: worker model fingerprint ab differs from the driver's cd: install\n"
    )
    assert root_cause(wrapped) == (
        "ManifestMismatch",
        "worker model fingerprint ab differs from the driver's cd: install",
    )
    assert root_cause(ValueError("plain message")) == ("ValueError", "plain message")
    assert root_cause(KeyError()) == ("KeyError", "")


def test_root_cause_skips_rays_wrappers():
    # Ray Data's error: the worker's traceback, ending in Ray's own wrapper exception
    text = (
        'ray::MapWorker(MapBatches(X)).submit() (pid=1)\n  File "t.py", line 3, in __call__\n'
        "RuntimeError: worker failure\n\nThe above exception was the direct cause of the following exception:\n\n"
        "ray.exceptions.UserCodeException: UDF failed to process a data block.\n"
    )
    assert root_cause(RuntimeError(text)) == ("RuntimeError", "worker failure")
    try:
        try:
            raise KeyError("k")
        except KeyError as inner:
            raise RuntimeError("UDF failed to process a data block.\nmore text") from inner
    except RuntimeError as outer:  # no traceback text anywhere: the deepest exception
        assert root_cause(outer) == ("KeyError", "'k'")


def test_the_workers_exception_is_found_by_type_not_by_its_text():
    """Ray attaches the worker's exception object (``RayTaskError.cause``; Ray Data's ``UserCodeException`` over it):
    it is the root cause, whatever a line of the traceback text looks like."""
    exceptions = pytest.importorskip("ray.exceptions")
    try:
        try:
            raise ValueError("bad batch")
        except ValueError as inner:
            raise exceptions.UserCodeException("UDF failed to process a data block.") from inner
    except exceptions.UserCodeException as user_code:
        text = "Traceback ...\nposfair.store.ManifestMismatch: a line of text that only looks like a refusal\n"
        task_error = exceptions.RayTaskError("MapBatches(ShardEncoder)", text, user_code)
    assert root_cause(task_error) == ("ValueError", "bad batch")
    assert root_cause(task_error.as_instanceof_cause()) == ("ValueError", "bad batch")


def test_a_lost_replica_is_told_by_rays_exception_class():
    ray = pytest.importorskip("ray")
    from posfair.distributed.ray_engine import _lost_worker

    died = ray.exceptions.ActorDiedError()
    assert _lost_worker(ray, died) == "ActorDiedError: The actor died unexpectedly before finishing this task."
    assert _lost_worker(ray, RuntimeError("wrapped")) is None
    try:
        raise RuntimeError("the pool failed") from ray.exceptions.WorkerCrashedError()
    except RuntimeError as wrapped:
        assert _lost_worker(ray, wrapped).startswith("WorkerCrashedError: The worker died unexpectedly")
    # a constructor that raised (e.g. the fingerprint refusal) lost no process: not a lost replica
    init_failed = ray.exceptions.ActorDiedError.from_task_error(
        ray.exceptions.RayTaskError("__init__", "ValueError: no", ValueError("no"))
    )
    assert _lost_worker(ray, init_failed) is None
    # text that reads like a death is not one
    assert _lost_worker(ray, RuntimeError("The actor died unexpectedly before finishing this task.")) is None
