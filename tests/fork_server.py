"""A process that imports posfair once and runs ``posfair ARGS`` in a fork of itself, per request.

Started by ``tests/test_readme.py`` as a fresh interpreter (``python tests/fork_server.py``),
so the forks it makes inherit nothing of the test process: no threads that another test
started (Ray's core worker and gRPC threads, torch's pools), which a fork of the test
process itself would copy half-alive and which crashed such a fork with SIGSEGV.  This
process never computes anything: it imports, then waits on its standard input.

Protocol: one JSON object per line on standard input, ``{"args", "cwd", "env", "out",
"err"}``; for each, the server forks, the child runs ``posfair.cli.main(args)`` with its
working directory, environment and standard output/error files set, and the server answers
one line ``{"pid": PID}`` at once and ``{"status": WAIT_STATUS}`` when the child ends.  The
server exits when its standard input closes (the test process ended).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback


def _child(req: dict) -> None:
    code = 1
    try:
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


def serve(requests, answers) -> None:
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)  # never returns
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"status": status}) + "\n")
        answers.flush()


if __name__ == "__main__":
    import posfair.cli
    import posfair.encoding  # noqa: F401  torch, transformers, sentence-transformers
    import posfair.fairness.ols  # noqa: F401  statsmodels

    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything the imports print goes to stderr, not into the answers
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin, answers)
