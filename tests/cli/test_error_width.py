"""An ``error:`` line is wrapped to the width of the stream it is written to, stderr, never to stdout's.

``posfair`` runs as a user runs it, in a process of its own, with stderr and stdout each a terminal (a pty of a
given number of columns) or a file, and no ``COLUMNS``: ``posfair ... > out.txt`` at an 80-column terminal shows
its error wrapped at words to 80 columns; ``posfair ... 2> err.log`` at a terminal logs it as one line, whole;
with both streams terminals of different widths, the error follows stderr's.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from posfair.cli import terminal

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="ptys are POSIX")

#: a command that fails at once, before any work, with an error of more than 80 characters
COMMAND = ["retrieval", "--benchmark", "no-such-benchmark"]


def _pty(columns: int) -> tuple[int, int]:
    """(master, slave) of a new pty whose terminal is ``columns`` wide."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, slave


def _drain(master: int, proc: subprocess.Popen) -> bytes:
    """Everything written to the pty of ``master`` until ``proc`` ended and the pty is empty."""
    got = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child's end closed: nothing more
                break
            if not data:
                break
            got += data
        elif proc.poll() is not None:
            break
    return got


def run(tmp_path: Path, stdout_columns: int | None, stderr_columns: int | None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``posfair COMMAND``, each stream a terminal of the columns given, else a file
    (no ``COLUMNS`` in its environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    streams, masters, files = {}, {}, {}
    for name, columns in (("stdout", stdout_columns), ("stderr", stderr_columns)):
        if columns is None:
            files[name] = open(tmp_path / f"{name}.txt", "wb")  # noqa: SIM115 (closed below)
            streams[name] = files[name]
        else:
            masters[name], streams[name] = _pty(columns)
    argv = [sys.executable, "-m", "posfair.cli", *COMMAND]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path, **streams)
    for name in masters:
        os.close(streams[name])  # the child holds its own copy
    text = {name: _drain(master, proc) for name, master in masters.items()}
    code = proc.wait(60)
    for name, f in files.items():
        f.close()
        text[name] = (tmp_path / f"{name}.txt").read_bytes()
    for master in masters.values():
        os.close(master)
    decoded = {name: data.decode().replace("\r\n", "\n") for name, data in text.items()}  # a pty writes CRLFs
    return code, decoded["stdout"], decoded["stderr"]


def whole_error(tmp_path: Path) -> str:
    """The command's error as one line: what it prints to a file (no width given)."""
    code, _, err = run(tmp_path, None, None)
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, (code, err)
    assert len(err.strip()) > 80  # long enough to wrap at 80 columns
    return err.strip()


def test_an_error_wraps_to_stderrs_terminal_when_stdout_is_a_file(tmp_path):
    """stderr an 80-column terminal, stdout redirected to a file (``posfair ... > out.txt``): the error is wrapped
    at words to 80 columns, as the terminal shows it.  (Wrapping by stdout's terminal, or by whether stdout is one,
    would print it as one long line here.)"""
    line = whole_error(tmp_path)
    code, out, err = run(tmp_path, None, 80)
    assert code == 2 and out == ""
    assert err.splitlines() == terminal.wrap(line, 80) and len(err.splitlines()) > 1, err


def test_an_error_stays_whole_in_a_file_when_stdout_is_a_terminal(tmp_path):
    """stdout an 80-column terminal, stderr redirected to a file (``posfair ... 2> err.log``): the error is one line,
    whole, for a log or grep (stdout being a terminal does not wrap it)."""
    line = whole_error(tmp_path)
    code, _, err = run(tmp_path, 80, None)
    assert code == 2 and err == line + "\n", err


def test_an_error_wraps_to_stderrs_width_when_both_are_terminals(tmp_path):
    """stdout a 200-column terminal, stderr a 50-column one: the error wraps at 50 columns (stderr's), not 200."""
    line = whole_error(tmp_path)
    code, _, err = run(tmp_path, 200, 50)
    assert code == 2 and err.splitlines() == terminal.wrap(line, 50), err
    assert all(len(text) <= 50 for text in err.splitlines()) and len(err.splitlines()) > 2, err
