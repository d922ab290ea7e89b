"""The private names of Ray, Ray Serve and uvicorn that posfair relies on live in one module,
:mod:`posfair.runtime.private_api`, and each still exists, shaped as posfair uses it, in the installed releases --
which ``pyproject.toml`` pins to the lines the module says it was checked on.  A Ray or uvicorn release that drops
or changes one fails here, naming it, instead of a server that quietly stops guarding itself."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import tomllib

from posfair.runtime import private_api as private

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "posfair"
HOME = SRC / "runtime" / "private_api.py"

#: what marks a private use: a private module of Ray, Ray's private environment variables and controller call, and
#: uvicorn's protocol internals (h11's connection state with them)
PRIVATE = re.compile(
    r"ray\._private|ray\._common|serve\._private|RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER|RAY_SERVE_[A-Z_]+|"
    r"get_serve_instance_details|uvicorn\.protocols|H11Protocol|HttpToolsProtocol|^h11$|add_port_to_grpc_server"
)


def _names_in(path: Path) -> list[tuple[int, str]]:
    """Every string constant, imported module and attribute of ``path`` that names a private thing of Ray/uvicorn."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(a.name for a in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Name):
            names = [node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") > 0:
            continue  # docstrings and long texts may say what the module does
        found += [(getattr(node, "lineno", 0), n) for n in names if PRIVATE.search(n)]
    return found


def test_no_private_name_outside_the_one_module():
    outside = {
        f"{p.relative_to(ROOT)}:{line}: {name}" for p in SRC.rglob("*.py") if p != HOME for line, name in _names_in(p)
    }
    assert not outside, sorted(outside)
    assert _names_in(HOME), "the scan finds nothing even in the module that holds the names: it is broken"


def _pins(extra: str) -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    out = {}
    for d in deps:
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)$", d)
        out.setdefault(m.group(1).lower(), m.group(3).strip())
    return out


@pytest.mark.parametrize("extra", ["serve", "ray", "dev"])
def test_ray_and_uvicorn_are_pinned_to_the_lines_checked(extra):
    ray = pytest.importorskip("ray")
    pins = _pins(extra)
    major, minor = (int(x) for x in private.TESTED_RAY.split("."))
    assert pins.get("ray") == f">={major}.{minor},<{major}.{minor + 1}", pins
    assert ray.__version__.startswith(private.TESTED_RAY + "."), ray.__version__
    if extra != "ray":  # posfair embed runs no HTTP server
        uvicorn = pytest.importorskip("uvicorn")
        major, minor = (int(x) for x in private.TESTED_UVICORN.split("."))
        assert pins.get("uvicorn") == f">={major}.{minor},<{major}.{minor + 1}", pins
        assert uvicorn.__version__.startswith(private.TESTED_UVICORN + "."), uvicorn.__version__


def test_rays_private_names_exist_as_used():
    pytest.importorskip("ray.serve")
    import ray._private.ray_constants as ray_constants
    import ray._private.worker as worker
    import ray.serve._private.constants as serve_constants
    import ray.serve._private.replica as replica
    from ray._private.authentication import authentication_token_setup
    from ray.serve._private.controller import ServeController

    # the switch Ray reads at import
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == private.RAY_LOCAL_ONLY_ENV
    # the proxy's callback variable, read from the environment of that name
    assert re.search(rf'get_env_str\(\s*"{private.SERVE_PROXY_CALLBACK_ENV}"', inspect.getsource(serve_constants))
    # the replica binds its gRPC server through the module's function, on every interface
    bind = getattr(replica, private.GRPC_BIND)
    assert list(inspect.signature(bind).parameters)[:2] == ["server", "address"]
    assert f'{private.GRPC_BIND}(self._server, "{private.GRPC_EVERY_INTERFACE}")' in inspect.getsource(replica)
    # the controller answers the instance's details
    assert callable(getattr(ServeController, "get_serve_instance_details", None))
    # the two notices come from the loggers the module quiets
    assert worker.logger.name == private.WORKER_LOGGER and private.OFF_MAIN_NOTICE in inspect.getsource(worker)
    assert authentication_token_setup.logger.name == private.AUTH_LOGGER
    assert "Token authentication is enabled" in inspect.getsource(authentication_token_setup)


def test_the_grpc_bind_is_handed_the_loopback(monkeypatch):
    """On an instance kept on the loopback the replica's bind of ``[::]:0`` becomes 127.0.0.1 (once), and nothing
    changes on one that is not."""
    pytest.importorskip("ray.serve")
    import ray.serve._private.replica as replica

    calls = []
    monkeypatch.setattr(replica, private.GRPC_BIND, lambda server, address: calls.append(address) or 1)
    monkeypatch.delenv(private.RAY_LOCAL_ONLY_ENV, raising=False)
    private.replica_grpc_on_loopback()
    getattr(replica, private.GRPC_BIND)(None, "[::]:0")
    monkeypatch.setenv(private.RAY_LOCAL_ONLY_ENV, "0")
    private.replica_grpc_on_loopback()
    private.replica_grpc_on_loopback()  # a second constructor: not wrapped twice
    getattr(replica, private.GRPC_BIND)(None, "[::]:0")
    getattr(replica, private.GRPC_BIND)(None, "10.0.0.1:5")
    assert calls == ["[::]:0", "127.0.0.1:0", "10.0.0.1:5"]


def test_uvicorns_private_names_exist_as_used():
    pytest.importorskip("uvicorn")
    for cls in private.http11_protocols():
        for method in private.UVICORN_METHODS:
            assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method}"
        source = inspect.getsource(cls)
        for attribute in (*private.UVICORN_ATTRIBUTES, *private.UVICORN_CLASS_ATTRIBUTES[cls.__name__]):
            assert f"self.{attribute}" in source, f"{cls.__name__}: self.{attribute}"
        assert "self.send_400_response(" in source, cls.__name__
    h11 = pytest.importorskip("h11")
    assert h11.DONE is private._h11_done()
