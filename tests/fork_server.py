"""A process that imports posfair once and runs ``posfair ARGS`` in a fork of itself, per request.

Started by ``tests/test_readme.py`` as a fresh interpreter (``python tests/fork_server.py``),
so the forks it makes inherit nothing of the test process: no threads that another test
started (Ray's core worker and gRPC threads, torch's pools), which a fork of the test
process itself would copy half-alive and which crashed such a fork with SIGSEGV.  This
process never computes anything: it imports, then waits on its standard input.

Protocol: one JSON object per line on standard input, ``{"id", "args", "cwd", "env", "out",
"err"}`` (optional ``"fsize"``: a file-size limit in bytes, ``RLIMIT_FSIZE``, and ``"nofile"``: an
open-file limit, the soft ``RLIMIT_NOFILE`` as ``ulimit -n`` sets it, both set in the child);
for each, the server forks, the child runs ``posfair.cli.main(args)`` with its working
directory, environment and standard output/error files set, and the server answers one line
``{"id": ID, "pid": PID}`` at once and ``{"id": ID, "status": WAIT_STATUS}`` when the child
ends.  Children run concurrently (several requests may be in flight); the server is one thread
(it waits on its input and reaps children in turn), so a fork copies no other thread.  The
server exits when its standard input closes (the test process ended), after its children; a
child still running then (the test process was killed) gets SIGTERM, and SIGKILL a minute later.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import time
import traceback


def _child(req: dict) -> None:
    code = 1
    try:
        if req.get("fsize") is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"]))  # SIGXFSZ: Python ignores it
        if req.get("nofile") is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (req["nofile"], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # not the server's request pipe
        os.close(devnull)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        sys.argv = ["posfair", *req["args"]]
        try:
            posfair.cli.main(req["args"])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _signal_all(children: dict[int, object], sig: int) -> None:
    for pid in children:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def serve(fd: int, answers) -> None:
    """Requests from the file descriptor ``fd`` until it closes; answers on ``answers`` (module docstring)."""

    def say(msg: dict) -> None:
        answers.write(json.dumps(msg) + "\n")
        answers.flush()

    children: dict[int, object] = {}  # pid -> the request's id
    pending, open_ = b"", True
    stopped_at = None  # when the request pipe closed with commands still running
    while open_ or children:
        if not open_ and children:
            # The test process is gone (killed: a finished one leaves no command running), so nobody will
            # collect these: stop them as a terminal's kill does (a `posfair serve` ends its Ray instance on
            # SIGTERM), then for good after a minute, rather than leave a server and its cluster behind.
            if stopped_at is None:
                stopped_at = time.monotonic()
                _signal_all(children, signal.SIGTERM)
            elif time.monotonic() - stopped_at > 60:
                _signal_all(children, signal.SIGKILL)
        # wait for a request; while children run, wake up every 50 ms to reap the finished ones
        if open_ and select.select([fd], [], [], 0.05 if children else None)[0]:
            chunk = os.read(fd, 65536)
            open_ = bool(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)  # never returns
                children[pid] = req.get("id")
                say({"id": req.get("id"), "pid": pid})
        elif not open_:
            time.sleep(0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            say({"id": children.pop(pid, None), "status": status})


if __name__ == "__main__":
    import posfair.cli
    import posfair.encoding  # noqa: F401  torch, transformers, sentence-transformers
    import posfair.stats.position_ols  # noqa: F401  statsmodels

    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything the imports print goes to stderr, not into the answers
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin.fileno(), answers)
