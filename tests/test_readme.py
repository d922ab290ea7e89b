"""The README runs as written: every shell command and every Python block, in order.

The set-up block is what ``.ci/run`` executes (a fresh virtual environment, then the
README's test command), so here it is checked against ``.ci/run`` line by line; its
last command (``posfair demo``) and every other command run in a scratch folder
with this interpreter's ``posfair``.  Each Python block runs in a fresh namespace,
so a block that uses a name it never defines fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(README.read_text(encoding="utf-8")) if kind == lang]


def commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    out, current = [], ""
    for line in block.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        out.append(_drop_comment(current).strip())
        current = ""
    return [c for c in out if c]


def _drop_comment(cmd: str) -> str:
    """The command without a trailing ``# comment`` (a ``#`` after white space, outside quotes)."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            return cmd[:i]
    return cmd


def setup_block() -> list[str]:
    first = blocks("bash")[0]
    return commands(first)


def test_setup_commands_are_what_ci_runs():
    """The README's two set-up commands are exactly what .ci/run executes."""
    install, tests = setup_block()
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [s.strip() for s in install.split("&&")]
    assert steps[-1] == ".venv/bin/posfair demo", steps
    # the same install steps, in the same order, as the first lines of .ci/run's first environment (pip's -q aside)
    ci_lines = [line.strip().replace(" -q ", " ") for line in ci.splitlines()]
    ci_steps = [line for line in ci_lines if line == "python3 -m venv .venv" or line.startswith(".venv/bin/pip")]
    assert ci_steps == steps[:-1], (ci_steps, steps)
    assert tests in ci, tests


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = cmd.replace(".venv/bin/", "")
    return subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)


def readme_commands() -> list[str]:
    """The demo (last set-up step), then every command of the other shell blocks, in order."""
    install, _tests = setup_block()
    cmds = [install.split("&&")[-1].strip()]
    for block in blocks("bash")[1:]:
        cmds += commands(block)
    return cmds


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory) -> Path:
    """One scratch folder for the README's commands: later ones use what earlier ones made."""
    return tmp_path_factory.mktemp("readme")


def test_the_readme_has_commands():
    assert len(readme_commands()) > 5


@pytest.mark.parametrize("index", range(len(readme_commands())), ids=lambda i: readme_commands()[i].split()[1][:20])
def test_every_readme_command_runs(index, readme_dir):
    """Each command exits 0, run in order in one folder (one test each, so pytest's progress moves)."""
    cmd = readme_commands()[index]
    res = _run(cmd, readme_dir)
    assert res.returncode == 0, f"{cmd}\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
    if index == 0:
        _check_demo_index(readme_dir / "posfair-demo")
    if cmd.startswith("posfair build-benchmark"):
        _check_benchmark_size(readme_dir / "bench")


def _check_benchmark_size(path: Path) -> None:
    """The README's example benchmark can separate methods: enough documents and queries in every position group."""
    from posfair.retrieval.benchmarks import MIN_QUERIES_PER_GROUP, load_benchmark

    size = load_benchmark(str(path), lang="en").size()
    assert not size.too_small, size.line()
    assert size.documents >= MIN_QUERIES_PER_GROUP and len(size.per_group) == 3
    assert min(size.per_group.values()) >= MIN_QUERIES_PER_GROUP, size.per_group


def _check_demo_index(out: Path) -> None:
    """The demo's index names each part's model and links each part's own report, which exists."""
    from posfair.bundled import e5_display_name

    index = (out / "report.html").read_text(encoding="utf-8")
    for folder, model in (("english", "all-MiniLM-L6-v2"), ("mixed", e5_display_name())):
        assert f'href="{folder}/report.html"' in index, folder
        assert model in index, model
        report = (out / folder / "report.html").read_text(encoding="utf-8")
        assert model in report, (folder, model)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_block_runs_alone(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = blocks("python")[index]
    exec(compile(code, f"README.md python block {index + 1}", "exec"), {"__name__": "__readme__"})
