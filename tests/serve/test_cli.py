"""``posfair serve``'s command without Ray: what it starts a server with (the server itself is stubbed)."""

from __future__ import annotations

import socket

import pytest

from posfair import Calibration

CAL = Calibration.parse("16,0.5,0.5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def started(monkeypatch):
    """The settings ``posfair serve`` would serve with: ``serve_model`` recorded, not run."""
    import posfair.serve.cluster as cluster
    import posfair.serve.runner as runner

    seen = []
    monkeypatch.setattr(runner, "serve_model", lambda settings, *a, **k: seen.append(settings))
    monkeypatch.delenv(cluster.RAY_LOCAL_ONLY_ENV, raising=False)  # what the command sets goes with the test
    return seen


def test_a_saved_calibrated_folder_is_served_as_encode_encodes_it(tiny_model_path, tmp_path, started):
    """Defect 9: ``serve --model FOLDER`` served the folder's saved calibration while ``encode -m FOLDER`` encodes
    stock and ``serve --help`` says the default is stock. One rule now: stock unless --calibration, with a note
    naming the saved calibration; --calibration serves it."""
    from typer.testing import CliRunner

    import posfair
    from posfair.cli import app

    path, pooling = tiny_model_path("bert")
    folder = tmp_path / "calibrated"
    posfair.load_model(path, pooling=pooling).set_calibration(CAL).save(str(folder))
    r = CliRunner().invoke(app, ["serve", "--model", str(folder), "--port", str(free_port())])
    assert r.exit_code == 0, r.output
    assert started[-1].args.calibration is None and "(stock," in r.output, r.output
    assert f"saved with calibration {CAL.label()}" in r.output and f"--calibration {CAL.spec()}" in r.output
    r = CliRunner().invoke(
        app, ["serve", "--model", str(folder), "--port", str(free_port()), "--calibration", CAL.spec()]
    )
    assert r.exit_code == 0 and Calibration.from_dict(started[-1].args.calibration) == CAL, r.output
    assert "saved with" not in r.output
    help_text = CliRunner().invoke(app, ["serve", "--help"]).output
    assert "none (stock)" in " ".join(help_text.split()).replace("( ", "(")  # the default the command keeps


def test_an_open_file_limit_ray_cannot_start_under_is_said_before_anything_loads(monkeypatch, started):
    """Defect 6 (ulimit -n 64): Ray's raylet crashed at start and posfair never came up nor exited. Now the limit is
    raised as far as the hard limit allows, and one under what Ray needs ends the command at once, exit 1, one line
    naming the limit, before the model loads."""
    import resource

    from typer.testing import CliRunner

    from posfair.cli import app

    limits = {"now": (64, 64)}
    monkeypatch.setattr(resource, "getrlimit", lambda what: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: limits.update(now=value))
    r = CliRunner().invoke(app, ["serve", "--port", str(free_port())])
    assert r.exit_code == 1 and "ulimit -n 64" in r.output and "starting" not in r.output, r.output
    assert not started
    limits["now"] = (64, 4096)  # a soft limit only: raised, and the server starts
    r = CliRunner().invoke(app, ["serve", "--port", str(free_port())])
    assert r.exit_code == 0 and limits["now"] == (4096, 4096) and started, r.output


def test_a_port_taken_after_the_check_is_said_as_the_port_check_says_it():
    """A port taken between the command's check and the bind of Serve's proxy ended in 'unexpected RayTaskError ...
    Failed to bind'; it is now the --port message (the command prints it as 'error: --port PORT: ...', exit 2)."""
    from posfair.serve.application import AppArgs
    from posfair.serve.runner import ServerSettings, _deploy_failure

    settings = ServerSettings(args=AppArgs(), host="127.0.0.1", port=8123)
    raised = RuntimeError(
        "ray::ProxyActor.ready() (pid=1)\n  ...\nOSError: [Errno 98] Failed to bind to address: Address already in use"
    )
    said = _deploy_failure(raised, settings)
    assert said == "--port 8123: cannot listen on 127.0.0.1:8123 (Address already in use)"
    other = _deploy_failure(RuntimeError("Deploying application posfair failed:\nValueError: no model there"), settings)
    assert other == "the server's application did not start: ValueError: no model there"


def test_the_replicas_health_is_noted_and_a_silent_ray_ends_the_server(monkeypatch):
    """Defect 8 (the model folder deleted, the replica killed: Serve restarted it every ~10 s, failing each time, and
    posfair printed nothing of its own) and defect 6 (the GCS killed: the process hung, then exited with only Ray's
    line). The server's watch of its application notes each change of health, with Serve's message, and ends the
    server in one line when Ray answers no more (twice in a row)."""
    import threading
    from types import SimpleNamespace

    from ray import serve

    import posfair.serve.runner as runner

    said = iter(
        [
            ("UNHEALTHY", "The deployment failed to start 3 times in a row.\nOSError: /srv/model: no such folder"),
            ("UNHEALTHY", "the same, again"),
            ("RUNNING", ""),
            RuntimeError("Failed to connect to GCS within 60 seconds"),
            RuntimeError("Failed to connect to GCS within 60 seconds"),
        ]
    )

    def status():
        now = next(said)
        if isinstance(now, Exception):
            raise now
        return SimpleNamespace(applications={"posfair": SimpleNamespace(status=now[0], message=now[1])})

    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(runner, "WATCH_PERIOD_S", 0.01)
    notes: list[str] = []
    with pytest.raises(runner.ServerFailed) as failed:
        runner._watch(threading.Event(), notes.append)
    assert notes == [
        "the model replicas are not healthy (UNHEALTHY): OSError: /srv/model: no such folder",
        "the model replicas are healthy again",
    ]
    assert failed.value.ray_failed and "\n" not in str(failed.value)
    assert "Failed to connect to GCS" in str(failed.value) and "cannot serve" in str(failed.value)


@pytest.mark.parametrize(
    ("said", "fails_after"),
    [
        (["x", "RUNNING", "x", "RUNNING", "x", "RUNNING"], None),  # one silent check at a time: never a failure
        (["RUNNING", "x", "x", "RUNNING"], 3),  # two in a row: the server ends at the second, not later
        (["x", "x"], 2),
        (["x", "RUNNING", "x", "x"], 4),  # the count starts again after an answer, and still counts
    ],
)
def test_the_watch_ends_the_server_after_two_silent_checks_in_a_row_only(monkeypatch, said, fails_after):
    """Issue 58 item 5: Ray not answering once (a slow controller) must not end a server, twice in a row must, and
    an answer in between starts the count again.  ``x``: Ray's status call fails."""
    import threading
    from types import SimpleNamespace

    from ray import serve

    import posfair.serve.runner as runner

    stop, calls = threading.Event(), []

    def status():
        calls.append(1)
        if len(calls) > len(said):
            stop.set()
            now = "RUNNING"
        else:
            now = said[len(calls) - 1]
        if now == "x":
            raise RuntimeError("Failed to connect to GCS")
        return SimpleNamespace(applications={"posfair": SimpleNamespace(status=now, message="")})

    monkeypatch.setattr(serve, "status", status)
    monkeypatch.setattr(runner, "WATCH_PERIOD_S", 0.01)
    if fails_after is None:
        runner._watch(stop, lambda line: None)
        assert len(calls) == len(said) + 1
    else:
        with pytest.raises(runner.ServerFailed):
            runner._watch(stop, lambda line: None)
        assert len(calls) == fails_after


def test_a_ray_that_cannot_start_under_a_memory_limit_is_said_with_the_limit(monkeypatch):
    """Defect 6 (ulimit -v 4000000): the start failed with "unexpected Exception: The current node timed out during
    startup" with no word of memory. The failure's line names the limit."""
    import resource

    import posfair.serve.cluster as cluster

    limits = {resource.RLIMIT_AS: (4_000_000 * 1024, resource.RLIM_INFINITY), resource.RLIMIT_NOFILE: (8192, 8192)}
    monkeypatch.setattr(resource, "getrlimit", lambda what: limits[what])
    assert "ulimit -v" in cluster._limits_hint() and "3906 MiB" in cluster._limits_hint()
    limits[resource.RLIMIT_AS] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert cluster._limits_hint() == ""


def test_a_local_server_starts_its_own_ray_even_beside_a_cluster_of_this_machine(monkeypatch):
    """Issue 58: ``ray.init()`` without an address joins the cluster last started on this machine (``ray start``,
    or a test's ``ray.cluster_utils.Cluster``), so ``posfair serve`` without ``--ray-address`` would have served on
    it, off the loopback (seen: a server beside the multi-node tests' cluster stopped with "Ray started on
    192.0.2.2, not on the loopback only").  Its Ray is asked for a new local instance; ``--ray-address`` is
    passed as given."""
    ray = pytest.importorskip("ray")
    import posfair.serve.cluster as cluster

    seen: list = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(kwargs["address"]))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.setattr(cluster.os, "environ", dict(cluster.os.environ))
    for address in (None, "local", "10.0.0.5:6379", "auto"):
        cluster.connect(address)
    assert seen == ["local", "local", "10.0.0.5:6379", "auto"]


def test_rays_notice_of_a_start_off_the_main_thread_is_not_printed(monkeypatch):
    """Issue 57 item 4.3: ``posfair serve`` printed Ray's "SIGTERM handler is not set because current thread is
    not the main thread" (ray.init runs in the server's start thread on purpose; the main thread takes the
    signals).  :func:`connect` in a helper thread, Ray's start stubbed to log as Ray's does there: that line
    reaches no handler, another of Ray's warnings still does; with posfair at DEBUG (``--debug``) it shows."""
    import logging
    import threading

    ray = pytest.importorskip("ray")
    import posfair.serve.cluster as cluster

    ray_log = logging.getLogger("ray._private.worker")

    def init(**kwargs):
        if threading.current_thread() is not threading.main_thread():  # as ray.init says it
            ray_log.warning("SIGTERM handler is not set because current thread is not the main thread.")
        ray_log.warning("another notice of Ray's")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    ray_log.addHandler(handler)
    posfair_log = logging.getLogger("posfair")
    level = posfair_log.level
    try:
        for posfair_level in (logging.WARNING, logging.DEBUG):
            posfair_log.setLevel(posfair_level)
            shown.clear()
            start = threading.Thread(target=cluster.connect, args=(None,))
            start.start()
            start.join(60)
            notice = [m for m in shown if m.startswith("SIGTERM handler is not set")]
            assert "another notice of Ray's" in shown, shown
            assert len(notice) == (posfair_level == logging.DEBUG), shown
    finally:
        ray_log.removeHandler(handler)
        posfair_log.setLevel(level)
    assert not ray_log.filters  # the filter is Ray's start's alone
