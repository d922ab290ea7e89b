"""``posfair ARGS`` as a shell runs it, without a fresh interpreter's start: forked by ``tests/fork_server.py``.

The server is a fresh interpreter started once per test process (on first use) that imports
posfair, torch, transformers, sentence-transformers and statsmodels, then forks a child per
request; each child runs the ``posfair`` script's entry point (``posfair.cli.main``) with its
own working directory, environment, standard output/error, logging, warnings and exit code.
That saves the ~11 s a fresh interpreter spends importing on this project's 2-core machine.
The fork is not of the test process itself: a test before it may have left threads there
(Ray's gRPC threads), and a fork copies them half-alive.  Several commands may run at once
(:meth:`ForkServer.start` returns at once; :meth:`ForkServer.wait` collects).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 1500  # seconds: the README's longest command (the demo) takes ~5 min on a loaded 2-core machine


def command_env() -> dict[str, str]:
    """The environment of a command: this one, this interpreter's scripts first on PATH, the hub offline."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


@dataclass
class Running:
    """A command started by the server: its request id, process id and output files."""

    id: int
    pid: int
    args: list[str]
    folder: tempfile.TemporaryDirectory

    @property
    def out(self) -> Path:
        return Path(self.folder.name) / "stdout"

    @property
    def err(self) -> Path:
        return Path(self.folder.name) / "stderr"


class ForkServer:
    """``tests/fork_server.py`` in a fresh interpreter; ``start`` / ``wait`` / ``run`` a command in a fork of it."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fork_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=command_env(),
            cwd=ROOT,
        )
        self.pending = b""
        self.answers: dict[int, list[dict]] = {}  # request id -> its answers not yet taken
        self.next_id = 0
        if self._read(TIMEOUT) is None:  # {"ready": true} once the imports are done
            raise RuntimeError("the fork server did not start")

    def _read(self, timeout: float) -> dict | None:
        """The server's next answer line, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.log.seek(0)
                raise RuntimeError(f"the fork server ended: {self.log.read().decode(errors='replace')[-3000:]}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def _answer(self, rid: int, key: str, timeout: float) -> dict | None:
        """The answer holding ``key`` to request ``rid`` (answers to other requests are kept for them)."""
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.answers.get(rid, []):
                if key in msg:
                    self.answers[rid].remove(msg)
                    return msg
            msg = self._read(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            self.answers.setdefault(msg.get("id"), []).append(msg)

    def start(self, args: list[str], cwd: Path, fsize: int | None = None, nofile: int | None = None) -> Running:
        """Start ``posfair ARGS`` in ``cwd`` (``fsize``: a file-size limit in bytes for the command; ``nofile``:
        its open-file limit, as ``ulimit -n`` sets it)."""
        rid, self.next_id = self.next_id, self.next_id + 1
        folder = tempfile.TemporaryDirectory()
        run = Running(rid, -1, list(args), folder)
        req = {"id": rid, "args": run.args, "cwd": str(cwd), "env": command_env(), "out": str(run.out),
               "err": str(run.err), "fsize": fsize, "nofile": nofile}  # fmt: skip
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        started = self._answer(rid, "pid", 60)
        if started is None:
            raise RuntimeError(f"the fork server did not start posfair {args}")
        run.pid = started["pid"]
        return run

    def wait(self, run: Running, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
        """The command's exit code and output, as ``subprocess.run`` gives them (killed after ``timeout``)."""
        try:
            done = self._answer(run.id, "status", timeout)
            if done is None:
                os.kill(run.pid, 9)
                self._answer(run.id, "status", 60)
                raise subprocess.TimeoutExpired(["posfair", *run.args], timeout)
            texts = [p.read_text(encoding="utf-8", errors="replace") if p.exists() else "" for p in (run.out, run.err)]
        finally:
            run.folder.cleanup()
        return subprocess.CompletedProcess(["posfair", *run.args], os.waitstatus_to_exitcode(done["status"]), *texts)

    def run(
        self, args: list[str], cwd: Path, fsize: int | None = None, nofile: int | None = None
    ) -> subprocess.CompletedProcess:
        return self.wait(self.start(args, cwd, fsize, nofile))


_SERVER: ForkServer | None = None


def server() -> ForkServer:
    """This test process's fork server (started on first use, again if it ended)."""
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = ForkServer()
    return _SERVER


def run_forked(
    args: list[str], cwd: Path, fsize: int | None = None, nofile: int | None = None
) -> subprocess.CompletedProcess:
    """``posfair ARGS`` in ``cwd``: the script's entry point in a fork of the fork server (module docstring);
    ``fsize`` / ``nofile``: a file-size / open-file limit for the command."""
    return server().run(args, cwd, fsize, nofile)
