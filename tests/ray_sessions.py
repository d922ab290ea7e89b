"""The processes of one Ray instance, told apart from those of any other instance on the machine.

A Ray instance started by ``ray.init`` lives in a session folder named after the process that
started it (``/tmp/ray/session_<date>_<time>_<pid>``).  Its servers name that folder on their
command line (``--session_dir=...``, ``--log_dir=...``) and its workers (replicas, idle workers)
hold their log files in it open, so a process belongs to the instance when its command line or
one of its open files names the folder.  Tests that check an instance ends with its driver use
this instead of a before/after count of Ray processes, which another test process starting its
own Ray instance at the same time (the suite runs on two workers) would upset.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RAY_TMP = Path("/tmp/ray")  # Ray's default temporary folder (RAY_TMPDIR is not set in the tests)


def sessions() -> set[Path]:
    """Every session folder on the machine now (Ray leaves them behind: take this before a command starts)."""
    return set(RAY_TMP.glob("session_*"))


def session_of(pid: int, before: set[Path]) -> Path | None:
    """The session folder of the Ray instance process ``pid`` started, among those not in ``before`` (an old
    folder may end in the same pid: process ids are reused)."""
    found = sorted(set(RAY_TMP.glob(f"session_*_{pid}")) - before)
    return found[-1] if found else None


def _names(pid: str, needle: str) -> bool:
    try:
        if needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if needle in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    return True
            except OSError:
                continue
    except OSError:  # the process ended meanwhile
        return False
    return False


def session_processes(session: Path, kinds: tuple[str, ...] = ()) -> list[str]:
    """Live processes of the instance whose session folder is ``session`` ("pid command" each); with
    ``kinds``, only those whose command line holds one of them (e.g. ``"ray::MapWorker"``, ``"ray/raylet"``)."""
    needle, me = str(session), str(os.getpid())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid == me or not _names(pid, needle):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd and (not kinds or any(k in cmd for k in kinds)):
            found.append(f"{pid} {cmd[:100]}")
    return found


def session_settles(session: Path, kinds: tuple[str, ...] = (), timeout: float = 60.0) -> list[str]:
    """Waits until the instance has no live process (of ``kinds``); returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = session_processes(session, kinds)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)
