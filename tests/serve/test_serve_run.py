"""``posfair.serve:app`` is a Ray Serve application builder: Serve's own ``serve run CONFIG`` starts it (the config
a ``serve deploy`` or a KubeRay RayService takes), with typed arguments read from the config's ``args``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tests import parent_bound

from posfair import Calibration
from posfair.encoding import encode_cached

pytestmark = pytest.mark.timeout(400, method="thread")

CAL = Calibration.parse("16,0.5,0.5")
LIMIT = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_builder_runs_under_serve_run_with_typed_args(tiny_model_path, tmp_path):
    """The builder's arguments are typed (a wrong one is refused naming it); ``serve run CONFIG`` serves encode's
    vectors with the calibration of its ``args``, asks the key named by ``api_key_env``, and stops on SIGINT."""
    import posfair
    from posfair.serve.application import AppArgs

    with pytest.raises(ValueError, match="replicas"):
        AppArgs.model_validate({"replicas": 0})
    with pytest.raises(ValueError, match="no_such_arg"):
        AppArgs.model_validate({"no_such_arg": 1})
    assert AppArgs.model_validate({"replicas": "2", "truncate": "true"}).replicas == 2  # as serve run KEY=VALUE

    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling, max_seq_length=LIMIT)
    port = free_port()
    config = tmp_path / "serve.json"  # YAML is a superset of JSON: serve run reads it as its YAML config
    config.write_text(
        json.dumps(
            {
                "proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": port},
                "applications": [
                    {
                        "name": "posfair",
                        "route_prefix": "/",
                        "import_path": "posfair.serve:app",
                        "args": {
                            "model": str(path),
                            "name": "tiny",
                            "pooling": pooling,
                            "max_seq_length": LIMIT,
                            "calibration": "16,0.5,0.5",
                            "api_key_env": "POSFAIR_TEST_RUN_KEY",
                        },
                    }
                ],
            }
        )
    )
    env = dict(os.environ, POSFAIR_TEST_RUN_KEY="run-key-42", HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)  # a Ray instance of its own, never another test's
    serve_cmd = Path(sys.executable).with_name("serve")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        # bound to this process: a killed test run leaves no `serve run` and no Ray instance behind
        argv = parent_bound.command([str(serve_cmd), "run", str(config)])
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        texts = ["a text served by serve run", "and a second one, a little longer than the first"]
        payload = json.dumps({"model": "tiny", "input": texts}).encode()
        head = {"Content-Type": "application/json"}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url + "/v1/embeddings", payload, head), timeout=60)
        assert err.value.code == 401
        head["Authorization"] = "Bearer run-key-42"
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/embeddings", payload, head), timeout=60) as r:
            body = json.loads(r.read())
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, encode_cached(model, texts, calibration=CAL), rtol=0, atol=1e-5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
