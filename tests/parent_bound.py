"""Run a command that ends when the test process that started it dies, however it dies.

``subprocess.Popen(parent_bound.command([...]))`` starts this file, which asks the kernel
(``prctl(PR_SET_PDEATHSIG, SIGINT)``) to send it SIGINT when its parent dies, then replaces
itself with the command (the setting survives ``execvp``; the command keeps this process's
pid).  A test that starts ``serve run`` (its own Ray instance) this way leaves no server and
no cluster behind when the test process is killed (a ``pkill pytest``, a CI timeout): Serve
shuts down on SIGINT as it does on Ctrl-C (SIGINT is reset to its default first: it may have
been ignored, as in a background job of a shell without job control).  No ``preexec_fn``, which is unsafe in a process
that has threads (a pytest worker may hold Ray's).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def command(argv: list[str], sig: int = signal.SIGINT) -> list[str]:
    """``argv`` run so that it gets ``sig`` when the calling process dies."""
    return [sys.executable, str(Path(__file__).resolve()), str(os.getpid()), str(int(sig)), *argv]


if __name__ == "__main__":
    parent, sig, *argv = sys.argv[1:]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        sys.exit(f"parent_bound: prctl failed (errno {ctypes.get_errno()})")
    if os.getppid() != int(parent):  # the parent died before the prctl: nobody will signal us
        sys.exit(f"parent_bound: the parent {parent} is gone")
    # a shell without job control starts background jobs with SIGINT ignored, and an ignored signal stays
    # ignored across exec: the command could then not be stopped by SIGINT (Serve's Ctrl-C) at all
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(argv[0], argv)
