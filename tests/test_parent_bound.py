"""The suite's long-lived children end with the test process, even when it is killed: the
``parent_bound`` launcher (``serve run``, the proxy under test) and the fork server's commands
(``posfair serve``) -- each checked by killing the parent with SIGKILL, which runs no cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests import parent_bound

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120, method="thread")


def _gone(pid: int, within: float) -> bool:
    """True once ``pid`` has ended (exited or a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_parent_bound_command_ends_when_its_parent_is_killed():
    # a parent that starts `sleep 600` through the launcher, says its pid, then waits; with SIGINT ignored,
    # as a background job of a shell without job control has it (and passes it on across exec)
    parent_code = (
        "import signal, subprocess, sys, time; sys.path.insert(0, sys.argv[1]); from tests import parent_bound; "
        "signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "p = subprocess.Popen(parent_bound.command(['sleep', '600'])); print(p.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code, str(ROOT)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        # the launcher has replaced itself with sleep under the same pid
        deadline = time.monotonic() + 30
        while b"sleep" not in Path(f"/proc/{child}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not _gone(child, 0.5)  # it runs while its parent lives
        parent.kill()
        parent.wait(30)
        assert _gone(child, 10), "the command outlived its killed parent"
    finally:
        parent.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_launcher_refuses_an_orphan_start():
    # the parent named on its command line is not its parent: it must not run the command unwatched
    r = subprocess.run([*parent_bound.command(["true"])[:2], "1", "2", "true"], capture_output=True, text=True)
    assert r.returncode != 0 and "is gone" in r.stderr


SERVER = """
import sys, time, types
sys.path.insert(0, sys.argv[1])
from tests import fork_server
# a command that runs until it is stopped, in place of posfair's entry point
fork_server.posfair = types.SimpleNamespace(cli=types.SimpleNamespace(main=lambda args: time.sleep(600)))
fork_server.serve(sys.stdin.fileno(), sys.stdout)
"""


def test_the_fork_servers_commands_end_when_the_test_process_is_gone(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(ROOT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    request = {"id": 7, "args": ["serve"], "cwd": str(tmp_path), "env": dict(os.environ)}
    request |= {"out": str(tmp_path / "out"), "err": str(tmp_path / "err")}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    child = json.loads(server.stdout.readline())["pid"]
    try:
        assert not _gone(child, 1.0)  # the command runs while the request pipe is open
        server.stdin.close()  # what the killed test process's end does to the pipe
        assert json.loads(server.stdout.readline()) == {"id": 7, "status": signal.SIGTERM}  # killed by SIGTERM
        assert server.wait(30) == 0
    finally:
        server.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
