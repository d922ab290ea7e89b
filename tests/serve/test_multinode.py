"""``posfair.serve:app`` on a Ray cluster of several nodes (``ray.cluster_utils.Cluster``: Ray's own way of running
many raylets on one machine, each a node with its own resources).

One cluster for the module: a head and a worker node of 1 CPU each (a third node joins for the last test).  Each
test deploys the application as users do -- the builder through ``serve.run``, or Serve's own config through
``serve run CONFIG`` (what ``serve deploy`` and a KubeRay RayService apply) -- and checks that it reaches RUNNING
and answers ``posfair encode``'s vectors.  On the code before, the default single replica asked for every CPU of the
whole cluster (2) and was never scheduled on nodes of 1.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tests import parent_bound

from posfair import Calibration
from posfair.encoding import encode_cached

pytestmark = [
    pytest.mark.timeout(600, method="thread"),
    pytest.mark.filterwarnings("ignore::posfair.calibration.coverage.CalibrationFallbackWarning"),
]

APP_NAME = "posfair"
LIMIT = 64
CAL = "16,0.5,0.5"
TEXTS = ["the first text of the cluster test", "a second one, somewhat longer than the first one is", "third"]
RUNNING_WITHIN_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node of 1 CPU each, Serve on the head at a free port; this process its driver."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    dashboard = free_port()  # serve deploy sends its config there (Serve's REST API)
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True, "dashboard_port": dashboard}
    )
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    c.dashboard_url = f"http://127.0.0.1:{dashboard}"
    try:
        yield c, port
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            c.shutdown()


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    import posfair

    path, pooling = tiny_model_path("bert")
    return str(path), pooling, posfair.load_model(path, pooling=pooling, max_seq_length=LIMIT)


def args_of(tiny, **more) -> dict:
    path, pooling, _ = tiny
    return {"model": path, "name": "tiny", "pooling": pooling, "max_seq_length": LIMIT, "calibration": CAL} | more


def wait_running(replicas: int | None = None) -> dict:
    """The application RUNNING (and its encoder with ``replicas`` replicas running), within the time."""
    from ray import serve

    deadline, seen = time.monotonic() + RUNNING_WITHIN_S, None
    while time.monotonic() < deadline:
        app = serve.status().applications.get(APP_NAME)
        if app is not None:
            encoder = app.deployments.get("PosfairEncoder")
            running = encoder.replica_states.get("RUNNING", 0) if encoder is not None else 0
            seen = (str(app.status), encoder.replica_states if encoder is not None else None, app.message)
            if str(getattr(app.status, "value", app.status)) == "RUNNING" and replicas in (None, running):
                return {"replicas": running}
        time.sleep(0.5)
    pytest.fail(f"the application did not reach RUNNING within {RUNNING_WITHIN_S:g} s: {seen}")


def post(
    port: int, texts: list[str], timeout: float = 30, headers: dict | None = None, model: str = "tiny"
) -> tuple[int, dict]:
    """The status and body of ``POST /v1/embeddings``; the answer's headers into ``headers`` when given."""
    body = json.dumps({"model": model, "input": texts}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings", body, {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            (headers if headers is not None else {}).update({k.lower(): v for k, v in r.headers.items()})
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        (headers if headers is not None else {}).update({k.lower(): v for k, v in e.headers.items()})
        return e.code, json.loads(e.read() or b"{}")


LONG = " ".join(["token"] * 200)  # over the 64-token limit


def assert_encodes(port: int, tiny) -> None:
    status, body = post(port, TEXTS)
    assert status == 200, body
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = encode_cached(tiny[2], TEXTS, calibration=Calibration.parse(CAL))
    np.testing.assert_allclose(got, want, atol=1e-5)


def replica_infos(count: int) -> list[dict]:
    """The encoder replicas' own word on where they run (node, torch threads), from ``count`` distinct replicas."""
    from ray import serve

    handle = serve.get_deployment_handle("PosfairEncoder", app_name=APP_NAME)
    seen: dict[float, dict] = {}
    for _ in range(50 * count):
        info = handle.info.remote().result(timeout_s=30)
        seen[info["started"], info["node"]] = info
        if len(seen) >= count:
            break
    return list(seen.values())


def run_builder(args: dict) -> None:
    from ray import serve

    from posfair.serve.application import AppArgs, app

    application = app(AppArgs.model_validate(args))
    # serve.run returns once the application runs (never, for replicas no node can hold): wait_running times it
    threading.Thread(
        target=serve.run, args=(application,), kwargs={"name": APP_NAME, "route_prefix": "/"}, daemon=True
    ).start()


def run_config(cluster, tmp_path: Path, args: dict, encoder: dict) -> None:
    """``serve run CONFIG`` against the cluster: Serve's config (``deployments:`` for PosfairEncoder) over the code."""
    c, port = cluster
    config = tmp_path / "serve.json"  # YAML is a superset of JSON: serve reads it as its YAML config
    app = {"name": APP_NAME, "route_prefix": "/", "import_path": "posfair.serve:app", "args": args}
    app["deployments"] = [{"name": "PosfairEncoder", **encoder}]
    http = {"host": "127.0.0.1", "port": port}
    config.write_text(json.dumps({"proxy_location": "HeadOnly", "http_options": http, "applications": [app]}))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    serve_cmd = Path(sys.executable).with_name("serve")
    r = subprocess.run(
        parent_bound.command([str(serve_cmd), "run", "--address", c.address, str(config), "--non-blocking"]),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.fixture
def deployed():
    """Deletes the test's application afterwards (the next test deploys its own)."""
    yield
    from ray import serve

    serve.delete(APP_NAME)


def test_defaults_fit_one_node(cluster, tiny, deployed):
    """No replicas, no resources given: one replica holding one node's CPUs (1 here), RUNNING, encode's vectors;
    the builder's ``truncate`` reaches the replica (a text over the limit is truncated and said so)."""
    from posfair.serve.application import AppArgs, encoder_settings

    _, actor = encoder_settings(AppArgs.model_validate(args_of(tiny)), [{"CPU": 1.0}, {"CPU": 1.0}])
    assert actor == {"num_cpus": 1}  # the whole cluster's 2 CPUs before: a replica no node could hold
    run_builder(args_of(tiny, truncate=True))
    wait_running(1)
    assert_encodes(cluster[1], tiny)
    (info,) = replica_infos(1)
    assert info["threads"] == 1
    headers: dict = {}
    status, body = post(cluster[1], [LONG], headers=headers)
    assert status == 200 and headers.get("x-posfair-truncated") == "1", (status, body, headers)


def test_replicas_spread_over_the_nodes(cluster, tiny, deployed):
    run_builder(args_of(tiny, replicas=2))
    wait_running(2)
    assert_encodes(cluster[1], tiny)
    infos = replica_infos(2)
    assert len({i["node"] for i in infos}) == 2 and {i["threads"] for i in infos} == {1}
    status, body = post(cluster[1], [LONG])  # no truncate: refused, naming the limit
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body


def test_serve_config_ray_actor_options_are_honoured(cluster, tiny, tmp_path, deployed):
    """The arguments ask 2 CPUs a replica (no node holds 2); Serve's config gives each replica 1 and two replicas:
    the config wins, as Serve applies a config over the code, and the replicas run torch on the CPU they hold."""
    run_config(
        cluster, tmp_path, args_of(tiny, replica_cpus=2), {"num_replicas": 2, "ray_actor_options": {"num_cpus": 1}}
    )
    wait_running(2)
    assert_encodes(cluster[1], tiny)
    assert {i["threads"] for i in replica_infos(2)} == {1}


def test_serve_config_autoscaling_is_honoured(cluster, tiny, tmp_path, deployed):
    autoscaling = {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 2, "target_ongoing_requests": 2}
    run_config(cluster, tmp_path, args_of(tiny), {"autoscaling_config": autoscaling, "num_replicas": "auto"})
    wait_running()
    assert_encodes(cluster[1], tiny)
    from ray import serve

    details = serve.status().applications[APP_NAME].deployments["PosfairEncoder"]
    assert sum(details.replica_states.values()) >= 1


def test_a_node_removed_while_serving(cluster, tiny, deployed):
    """Two replicas on two of three nodes; the worker node of one is removed while requests run: requests answer
    again (on the replica left, then on its replacement on the node left free), never 500, and the vectors are
    encode's."""
    c, port = cluster
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    run_builder(args_of(tiny, replicas=2))
    wait_running(2)
    infos = replica_infos(2)
    victim = next(n for n in c.list_all_nodes() if n is not c.head_node and n.node_id in {i["node"] for i in infos})
    c.remove_node(victim)
    statuses, deadline = [], time.monotonic() + 90
    while time.monotonic() < deadline:
        headers: dict = {}
        status, body = post(port, TEXTS, headers=headers)
        statuses.append(status)
        assert status in (200, 503), body
        assert status == 200 or headers.get("retry-after") == "1", headers
        if status == 200 and statuses.count(200) >= 3:
            break
        time.sleep(0.3)
    assert statuses[-1] == 200, statuses
    assert_encodes(port, tiny)
    # the lost replica is replaced on the node left free (Serve's status may still count the dead one a moment)
    deadline, nodes = time.monotonic() + RUNNING_WITHIN_S, set()
    while time.monotonic() < deadline:
        nodes = {i["node"] for i in replica_infos(2)}
        if len(nodes) == 2:
            break
        time.sleep(1)
    assert victim.node_id not in nodes and len(nodes) == 2 and nodes <= {n.node_id for n in c.list_all_nodes()}
    assert_encodes(port, tiny)


def documented_config() -> dict:
    """The many-machines config of the serving-in-production page, as a user copies it."""
    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "serving-production.md").read_text()
    (block,) = re.findall(r"```yaml\n(# serve.yaml -- posfair on a Ray cluster of many machines.*?)```", page, re.S)
    return yaml.safe_load(block)


def test_serve_deploy_of_the_documented_config(cluster, tmp_path, deployed):
    """``serve deploy`` of the documented config onto the running two-node cluster: RUNNING, its autoscaling's
    initial replicas spread over both nodes, answering the bundled model's vectors.  Only where it listens is
    changed: this cluster runs on one machine, where its nodes' proxies would share one address."""
    import posfair

    c, port = cluster
    config = documented_config()
    assert config["applications"][0]["args"]["model"] == "bundled"
    config["proxy_location"], config["http_options"] = "HeadOnly", {"host": "127.0.0.1", "port": port}
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(config))
    serve_cmd = Path(sys.executable).with_name("serve")
    r = subprocess.run(
        parent_bound.command([str(serve_cmd), "deploy", "--address", c.dashboard_url, str(path)]),
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    initial = config["applications"][0]["deployments"][0]["autoscaling_config"]["initial_replicas"]
    wait_running(initial)
    model = posfair.load_model()  # the bundled model
    texts = ["a query about the cluster", "a passage that the replicas on two nodes encode"]
    status, body = post(port, texts, model="bundled")
    assert status == 200, body
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = encode_cached(model, texts, calibration=Calibration.parse(config["applications"][0]["args"]["calibration"]))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert len({i["node"] for i in replica_infos(initial)}) == 2
