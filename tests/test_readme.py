"""The README and every page of the documentation site run as written: every shell command and Python block.

The set-up block is what ``.ci/run`` executes (a fresh virtual environment, then the
README's test command), so here it is checked against ``.ci/run`` line by line; its
last command (``posfair demo``) and every other command run in a scratch folder
with this interpreter's ``posfair``.  Each Python block runs in a fresh namespace,
so a block that uses a name it never defines fails.

Every ``posfair`` command (the demo and the Ray command among them) runs the script's entry point
in a fork of a server process that imported posfair once (``tests/forked.py``), with its own
working directory, environment, logging, warnings and exit code, as in a shell;
``test_a_forked_command_...`` checks a fork against the script.  The forks are not of the test
process: a test before may have left threads here (Ray's gRPC threads), which a fork copies
half-alive.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from forked import TIMEOUT, command_env, run_forked, server
from ray_sessions import session_of, session_settles, sessions

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)


#: a page's ``posfair serve`` section: a server command that runs until stopped, then commands and Python blocks
#: that talk to it; the generic runs below leave it out, test_the_serve_sections runs it (run_serve_section)
SERVE_SECTION = re.compile(r"^<!-- posfair-serve -->\n(.*?)^<!-- /posfair-serve -->", re.M | re.S)


def pages() -> list[Path]:
    """Every page whose blocks run: the README, then each page of the documentation site (``docs/``, MkDocs)."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)]


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def items(page: Path) -> list[tuple[str, str]]:
    """The page's ``bash`` and ``python`` blocks in order, as (kind, text), outside its serve section."""
    text = SERVE_SECTION.sub("", page.read_text(encoding="utf-8"))
    return [(kind, body) for kind, body in FENCE.findall(text) if kind in ("bash", "python")]


def blocks(lang: str, text: str | None = None, page: Path = README) -> list[str]:
    """The ``lang`` blocks of ``text`` (default: ``page`` without its serve section)."""
    if text is None:
        text = SERVE_SECTION.sub("", page.read_text(encoding="utf-8"))
    return [body for kind, body in FENCE.findall(text) if kind == lang]


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
    # (an install step may run under .ci/run's ``retry``, which reruns the same command)
    ci_lines = [line.strip().removeprefix("retry ").replace(" -q ", " ") for line in ci.splitlines()]
    ci_steps = [line for line in ci_lines if line == "python3 -m venv .venv" or line.startswith(".venv/bin/pip")]
    # then only the documentation site's tools (the docs extra, for `mkdocs build --strict`)
    assert ci_steps[: len(steps) - 1] == steps[:-1], (ci_steps, steps)
    assert ci_steps[len(steps) - 1 :] == ['.venv/bin/pip install -e ".[docs]"'], ci_steps
    assert tests in ci, tests


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = cmd.replace(".venv/bin/", "")
    return subprocess.run(cmd, shell=True, cwd=cwd, env=command_env(), capture_output=True, text=True, timeout=TIMEOUT)


def _forkable(cmd: str) -> list[str] | None:
    """The arguments of a plain ``posfair`` command (None: not one; run it in a shell)."""
    if any(ch in cmd for ch in "&|;<>$`"):
        return None
    tokens = shlex.split(cmd.replace(".venv/bin/", ""))
    if not tokens or tokens[0] != "posfair":
        return None
    return tokens[1:]


def page_steps(page: Path) -> list[tuple[str, str]]:
    """The page's steps in order: ("cmd", a shell command) and ("py", a Python block).  On the README the demo
    (the set-up block's last step) comes first and the set-up block is left out; on a docs page a block equal to
    the README's set-up block is left out too (it is CI's own set-up: test_a_docs_setup_block_is_the_readmes)."""
    setup = blocks("bash")[0]
    steps: list[tuple[str, str]] = []
    if page == README:
        install, _tests = setup_block()
        steps.append(("cmd", install.split("&&")[-1].strip()))
    for i, (kind, body) in enumerate(items(page)):
        if kind == "bash":
            if body == setup:
                assert page != README or i == 0, "the README's set-up block comes first"
                continue
            steps += [("cmd", c) for c in commands(body)]
        else:
            steps.append(("py", body))
    return steps


def page_commands(page: Path) -> list[str]:
    return [text for kind, text in page_steps(page) if kind == "cmd"]


def readme_commands() -> list[str]:
    """The demo (last set-up step), then every command of the README's other shell blocks, in order."""
    return page_commands(README)


def test_a_docs_setup_block_is_the_readmes():
    """A docs page that shows the set-up shows exactly the README's (which test_setup_commands_are_what_ci_runs
    holds to .ci/run): a changed copy would not run anywhere."""
    setup = blocks("bash")[0]
    for page in pages()[1:]:
        for kind, body in items(page):
            if kind == "bash" and "pip install" in body:
                assert body == setup, f"{page_name(page)}: a set-up block that is not the README's"


#: the options by which a README command names what it writes
_OUTPUT_OPTIONS = ("--out", "-o", "--save-model")


def _names(token: str) -> set[str]:
    """The top-level file or folder names a token may refer to (``a/b`` -> ``a``; ``k=v,w`` -> ``v``, ``w``)."""
    parts = re.split(r"[=,]", token)
    return {part.split("/")[0] for part in parts if part and not part.startswith("-")}


def readme_chains(cmds: list[str] | list[tuple[str, str]]) -> list[int]:
    """The chain of each step (a command, or ("cmd" | "py", text)): a command joins the chain of every earlier
    command whose output (``--out``, ``-o``, ``--save-model``) it names, merging them; a Python block joins the
    chains of the earlier commands whose output it names as a string, and otherwise stands alone.  Chains share no
    file, so they run side by side (pytest-xdist), each in page order in its own folder."""
    chain_of: list[int] = []
    writer: dict[str, int] = {}  # top-level output name -> the chain that wrote it
    new = 0
    for step in cmds:
        kind, text = step if isinstance(step, tuple) else ("cmd", step)
        if kind == "cmd":
            tokens = shlex.split(text)
            outputs = {tokens[i + 1].split("/")[0] for i, t in enumerate(tokens[:-1]) if t in _OUTPUT_OPTIONS}
            joined = {writer[name] for t in tokens for name in _names(t) if name in writer}
        else:
            outputs = set()
            joined = {writer[name] for s in string_constants(text) for name in _names(s) if name in writer}
        if joined:
            chain = min(joined)
        else:
            chain, new = new, new + 1
        chain_of = [chain if c in joined else c for c in chain_of]
        writer = {name: (chain if c in joined else c) for name, c in writer.items()}
        chain_of.append(chain)
        writer.update(dict.fromkeys(outputs, chain))
    return chain_of


def test_readme_chains_follow_the_files_commands_share():
    """A command that reads another's output runs after it, in its folder; unrelated commands are apart."""
    cmds = [
        "posfair demo",
        "posfair build-benchmark --out bench --k 3",
        "posfair audit --docs 4 --out a",
        "posfair retrieval --benchmark bench --out r",
        "posfair sweep --benchmark other --cache r/embeddings --out s",
        "posfair estimate-prior --out prior.json",
        "posfair attention --calibration 16,0.5,1,prior=prior.json --out att",
        "posfair verify a",
        "posfair embed --corpus bench --out a/x",  # joins bench's chain and a's: one chain from here on
    ]
    assert readme_chains(cmds) == [0, 1, 1, 1, 1, 3, 3, 1, 1]
    assert readme_chains(cmds[:-1]) == [0, 1, 2, 1, 1, 3, 3, 2]
    # a Python block that names a command's output runs after it in its chain; one that names none stands alone
    steps = [("cmd", "posfair fit --out repaired"), ("py", 'm = load("repaired")'), ("py", 'x = "other"')]
    assert readme_chains(steps) == [0, 0, 1]


def command_outputs(cmd: str) -> set[str]:
    """The top-level names a README command writes (its ``--out``, ``-o``, ``--save-model``)."""
    tokens = shlex.split(cmd)
    return {tokens[i + 1].split("/")[0] for i, t in enumerate(tokens[:-1]) if t in _OUTPUT_OPTIONS}


def string_constants(code: str) -> set[str]:
    """Every string constant of a Python block (the names it may write or read among them)."""
    import ast

    return {n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def ignored(name: str, is_dir: bool) -> bool:
    """Is a top-level ``name`` of a clone ignored by the repository's ``.gitignore`` (read as git reads it: the
    last matching pattern decides, ``!`` re-includes, a pattern ending in ``/`` matches folders only)?"""
    import fnmatch

    verdict = False
    for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!")
        dir_only, pattern = pattern.endswith("/"), pattern.strip("/")
        if "/" in pattern or (dir_only and not is_dir):  # a path below the root; a folder pattern, a file
            continue
        if fnmatch.fnmatchcase(name, pattern):
            verdict = not negate
    return verdict


def written(folder: Path) -> list[tuple[str, bool]]:
    """The top-level entries of ``folder``: (name, is a folder)."""
    return sorted((p.name, p.is_dir()) for p in folder.iterdir())


def check_left_ignored(folder: Path, what: str) -> None:
    """Everything ``what`` (README examples run in ``folder``, as in a clone) left is ignored by git."""
    shown = [name + ("/" if is_dir else "") for name, is_dir in written(folder) if not ignored(name, is_dir)]
    assert not shown, f"{what} leaves what git status shows in a clone: {shown} (add it to .gitignore)"


def test_each_readme_example_writes_names_of_its_own_which_git_ignores():
    """Issue 49 item 6: the Python evaluator block and the CLI audit both wrote ``audit-out`` and ``cache``, so the
    command warned that it replaced the block's results, and a clone ran through the README held 21 untracked
    folders.  On each page, each name a command writes is written by that command alone, a Python block that
    names it runs after it in its chain (it reads it), and .gitignore covers it; what every example writes is
    checked where it runs (the chain classes, test_every_python_block_runs_alone)."""
    for page in pages():
        writers: dict[str, list[str]] = {}
        for cmd in page_commands(page):
            for name in command_outputs(cmd):
                writers.setdefault(name, []).append(cmd)
        twice = {name: cmds for name, cmds in writers.items() if len(cmds) > 1}
        assert not twice, (page_name(page), twice)
        for name in writers:
            assert ignored(name, is_dir=not Path(name).suffix), f"{page_name(page)}: {name}: not in .gitignore"
    assert any(page_commands(page) for page in pages())


def test_the_ignore_check_reads_gitignore_as_git_does():
    """:func:`ignored` answers as ``git check-ignore`` for the README's outputs and for files of the project."""
    import shutil

    git = shutil.which("git")
    if git is None or subprocess.run([git, "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    names = {(name, not Path(name).suffix) for page in pages() for cmd in page_commands(page)
             for name in command_outputs(cmd)}  # fmt: skip
    names |= {("README.md", False), ("src", True), ("tests", True), ("posfair-demo", True), ("notes.txt", False),
              (".emb.parquet.posfair-cache", True), ("__pycache__", True), ("posfair-demo", False)}  # fmt: skip
    for name, is_dir in sorted(names):
        path = name + ("/" if is_dir else "")
        git_says = subprocess.run([git, "check-ignore", "--no-index", "-q", path], cwd=ROOT).returncode == 0
        assert ignored(name, is_dir) == git_says, (path, git_says)


def test_the_readme_curl_commands_end_their_output_with_a_newline(tmp_path):
    """Issue 49 item 6: the two curl commands printed their JSON with no newline between them.  Each curl command
    of the serve section, run against a server that answers JSON without a newline, ends its output with one."""
    import http.server
    import shutil
    import threading

    if shutil.which("curl") is None:
        pytest.skip("no curl")

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 -- http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b'{"object": "list", "data": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    sections = [s for s in (serve_section(p.read_text(encoding="utf-8")) for p in pages()) if s is not None]
    curls = [c for _serve_cmd, cmds, _pys in sections for c in cmds if c.startswith("curl ")]
    assert len(sections) >= 2 and len(curls) >= 3, curls
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        script = "\n".join(re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", c) for c in curls)
        res = subprocess.run(script, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        httpd.shutdown()
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ['{"object": "list", "data": []}'] * len(curls), res.stdout


def test_the_readme_has_commands():
    assert len(readme_commands()) > 3
    assert sum(len(page_commands(p)) for p in pages()) > 15


def _run_step(page: Path, index: int, folder: Path) -> None:
    """A page's step in its chain's folder: a command exits 0 (the demo's index and a built benchmark's size are
    checked; a Ray command leaves no Ray instance behind), a Python block runs; either leaves only ignored names."""
    kind, text = page_steps(page)[index]
    if kind == "py":
        _run_python(text, f"{page_name(page)} python step {index + 1}", folder)
        check_left_ignored(folder, f"{page_name(page)}'s examples up to step {index + 1}")
        return
    cmd = text
    args = _forkable(cmd)
    session = None
    if args is None:
        res = _run(cmd, folder)
    else:
        before = sessions()
        run = server().start(args, folder)
        res = server().wait(run)
        session = session_of(run.pid, before)  # the Ray instance the command started, if it started one
    assert res.returncode == 0, f"{cmd}\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
    assert "replacing the results" not in res.stderr, f"{cmd} replaced an earlier example's results: {res.stderr}"
    check_left_ignored(folder, f"{page_name(page)}'s commands up to {cmd!r}")
    if page == README and index == 0:
        _check_demo_index(folder / "posfair-demo")
    if cmd.startswith("posfair build-benchmark"):
        _check_benchmark_size(folder / command_outputs(cmd).pop())
    if "--workers" in cmd or "--ray-address" in cmd:
        _check_ray_embed(page, cmd, res, session, folder)
    else:
        assert session is None, f"{cmd} started a Ray instance"


def _run_python(code: str, name: str, folder: Path) -> None:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(cwd)


def _check_ray_embed(
    page: Path, cmd: str, res: subprocess.CompletedProcess, session: Path | None, folder: Path
) -> None:
    """A page's ``posfair embed --workers 2``: its own Ray instance, ended with every process of it when the
    command ends; only posfair's own lines on the terminal; the vectors of the single-process ``embed`` before it
    (the same documents, model, calibration and token limit; other shards: equal to summation order)."""
    import numpy as np

    import posfair
    from posfair import Calibration
    from posfair.retrieval.benchmarks import load_benchmark
    from posfair.store import EmbeddingStore, embedding_namespace, text_key

    assert "engine: a local Ray instance, 2 workers\n" in res.stdout and "2 workers, padding waste" in res.stdout, (
        res.stdout
    )
    assert session is not None, "the command started no Ray instance of its own"
    left = session_settles(session)
    assert not left, f"the command's Ray instance outlived it: {left}"
    # Ray's notice about its own token authentication and its C++ log lines are not passed on (they are with --debug)
    assert "Token authentication" not in res.stderr and not re.search(r"\.cc:\d+", res.stderr), res.stderr
    # the single-process `posfair embed` before it on the page, with the same corpus, calibration and limit
    single = next(c for c in page_commands(page) if c.startswith("posfair embed") and "--workers" not in c)

    def opt(c: str, name: str) -> str:
        tokens = shlex.split(c)
        return tokens[tokens.index(name) + 1]

    for name in ("--corpus", "--part", "--calibration", "--max-seq-length"):
        assert opt(cmd, name) == opt(single, name), (name, cmd, single)
    assert opt(cmd, "--calibration") == "default"
    model = posfair.load_model(max_seq_length=int(opt(cmd, "--max-seq-length")))
    keys = [text_key(t) for t in dict.fromkeys(load_benchmark(str(folder / opt(cmd, "--corpus"))).corpus_texts)]
    assert f"{len(keys)} distinct texts" in res.stdout, res.stdout
    stores = [EmbeddingStore(folder / opt(c, "--out")) for c in (cmd, single)]
    ray, local = (embedding_namespace(s, model.fingerprint, Calibration()).get(keys) for s in stores)
    np.testing.assert_allclose(ray, local, rtol=0, atol=1e-5)


def _page_slug(page: Path) -> str:
    return re.sub(r"\W", "_", page.relative_to(DOCS).with_suffix("").as_posix()).title().replace("_", "")


def _chain_class(page: Path, chain: int, indices: list[int]) -> type:
    """The test class of one chain of a page: its steps, one test each (pytest's progress moves), in page order,
    in one folder.  pytest-xdist (``--dist loadscope``, pyproject.toml) runs a class on one worker, in order."""
    steps = page_steps(page)

    def step_id(i: int) -> str:
        kind, text = steps[i]
        return text.split()[1][:20] if kind == "cmd" else f"python{i + 1}"

    class Chain:
        @pytest.fixture(scope="class")
        def folder(self, tmp_path_factory) -> Path:
            return tmp_path_factory.mktemp(f"docs-chain{chain}")

        @pytest.mark.parametrize("index", indices, ids=[step_id(i) for i in indices])
        def test_step_runs(self, index, folder):
            _run_step(page, index, folder)

    prefix = "TestReadmeChain" if page == README else f"TestDocs{_page_slug(page)}Chain"
    Chain.__name__ = Chain.__qualname__ = f"{prefix}{chain}"
    Chain.page = page
    return Chain


def _chained(page: Path) -> dict[int, list[int]]:
    """The page's chains (chain -> its step indices) that hold a command: a Python block alone runs on its own."""
    steps, chains = page_steps(page), readme_chains(page_steps(page))
    out: dict[int, list[int]] = {}
    for i, c in enumerate(chains):
        out.setdefault(c, []).append(i)
    return {c: ix for c, ix in out.items() if any(steps[i][0] == "cmd" for i in ix)}


def alone_blocks() -> list[tuple[Path, int]]:
    """(page, step index) of every Python block that names no command's output: each runs alone."""
    found = []
    for page in pages():
        in_chains = {i for ix in _chained(page).values() for i in ix}
        found += [(page, i) for i, (kind, _) in enumerate(page_steps(page)) if kind == "py" and i not in in_chains]
    return found


def _define_chain_classes() -> None:
    for page in pages():
        for chain, indices in sorted(_chained(page).items()):
            cls = _chain_class(page, chain, indices)
            globals()[cls.__name__] = cls


_define_chain_classes()


def test_every_step_is_in_one_chain_class_or_runs_alone():
    """Every command and block of every page runs, once: in one chain class, or (a Python block) alone."""
    ran = {}
    for name, cls in globals().items():
        if name.startswith(("TestReadmeChain", "TestDocs")):
            for i in cls.test_step_runs.pytestmark[0].args[1]:
                ran.setdefault(page_name(cls.page), []).append(i)
    for page, i in alone_blocks():
        ran.setdefault(page_name(page), []).append(i)
    for page in pages():
        assert sorted(ran.get(page_name(page), [])) == list(range(len(page_steps(page)))), page_name(page)


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


@pytest.mark.parametrize(("page", "index"), alone_blocks(), ids=[f"{page_name(p)}:{i + 1}" for p, i in alone_blocks()])
def test_every_python_block_runs_alone(page, index, tmp_path):
    code = page_steps(page)[index][1]
    _run_python(code, f"{page_name(page)} python step {index + 1}", tmp_path)
    # what it wrote is its own (no command of its page writes it, no other block there names it), and git ignores
    # it in a clone
    check_left_ignored(tmp_path, f"{page_name(page)} python step {index + 1}")
    made = {name for name, _ in written(tmp_path)}
    commands_write = {name for cmd in page_commands(page) for name in command_outputs(cmd)}
    others = set().union(
        *(string_constants(b) for i, (k, b) in enumerate(page_steps(page)) if k == "py" and i != index)
    )
    assert not made & (commands_write | others), f"{page_name(page)} step {index + 1} writes what another example does"


def test_the_demo_is_the_chain_the_suite_starts_first():
    """tests/conftest.py collects TestReadmeChain0 first (the longest test): that chain is the demo, alone."""
    from suite_order import LONG_FIRST, scope_rank

    chains = readme_chains(page_steps(README))
    assert readme_commands()[0].endswith("posfair demo") and chains.count(0) == 1
    assert LONG_FIRST[0] == "tests/test_readme.py::TestReadmeChain0"
    assert scope_rank("tests/test_readme.py::TestReadmeChain0::test_command_runs[demo]") == 0
    assert scope_rank("tests/test_readme.py::TestReadmeChain01::x") == LONG_FIRST.index("tests/test_readme.py")
    assert scope_rank("tests/test_readme_other.py::x") == len(LONG_FIRST)


def test_a_forked_command_reports_its_exit_code_and_output_and_leaves_this_process_alone(tmp_path):
    """The forked runner is the shell's equivalent: a mistake is `error: ...` with exit 2, a success exit 0 with
    its output, in the given folder; this process keeps its working directory and environment, and the forks
    are made by the server's interpreter, not by this process (whose threads a fork would copy half-alive)."""
    cwd, env = os.getcwd(), dict(os.environ)
    assert run_forked(["--version"], tmp_path).returncode == 0
    assert server().proc.pid != os.getpid() and server().proc.poll() is None  # the forks' parent: its own interpreter
    bad = run_forked(["audit", "--docs", "0", "--out", "x"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "--docs" in bad.stderr, bad
    for args in (["verify", "."], ["--help"]):  # exit 2 (not a store) and exit 0: as the script says them
        forked, shell = run_forked(args, tmp_path), _run(shlex.join(["posfair", *args]), tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (shell.returncode, shell.stdout, shell.stderr)
        assert forked.returncode == (0 if args == ["--help"] else 2) and (forked.stdout or forked.stderr)
    assert os.getcwd() == cwd and dict(os.environ) == env
    assert _forkable("posfair embed --corpus bench --workers 2") == ["embed", "--corpus", "bench", "--workers", "2"]
    assert _forkable("posfair a && b") is None
    assert _forkable(".venv/bin/posfair verify cache") == ["verify", "cache"]


def serve_section(text: str) -> tuple[str, list[str], list[str]] | None:
    """(the serve command, the shell commands after it, the Python blocks) of the serve section of ``text``."""
    found = SERVE_SECTION.search(text)
    if found is None:
        return None
    cmds = [c for block in blocks("bash", found.group(1)) for c in commands(block)]
    assert cmds and cmds[0].startswith("posfair serve "), cmds
    return cmds[0], cmds[1:], blocks("python", found.group(1))


def run_serve_section(text: str, folder: Path, while_up=None) -> list[str]:
    """Start the section's ``posfair serve`` (forked; its port swapped for a free one in every command and block),
    wait for its URL, run each command (exit 0, an OpenAI answer on stdout) and each Python block against it, then
    ``while_up(base_url)`` if given, stop it with SIGTERM (exit 0, its Ray instance gone); returns the commands'
    outputs."""
    import json
    import signal
    import socket
    import time

    serve_cmd, cmds, pys = serve_section(text)
    args = _forkable(serve_cmd)
    port = shlex.split(serve_cmd)[shlex.split(serve_cmd).index("--port") + 1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = str(s.getsockname()[1])
    swap = lambda c: c.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free}")  # noqa: E731
    args[args.index("--port") + 1] = free
    before = sessions()
    run = server().start(args, folder)
    stopped, outputs = False, []
    try:
        deadline = time.monotonic() + 300
        while f"at http://127.0.0.1:{free} " not in (run.out.read_text() if run.out.exists() else ""):
            err = run.err.read_text() if run.err.exists() else ""
            assert time.monotonic() < deadline and "error:" not in err, f"{serve_cmd} did not start: {err[-2000:]}"
            time.sleep(0.5)
        session = session_of(run.pid, before)
        for cmd in cmds:
            res = _run(swap(cmd), folder)
            assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            assert res.stdout.endswith("\n"), f"{cmd}: its JSON runs into what follows"
            answer = json.loads(res.stdout)
            assert answer["object"] == "list" and answer["data"], answer
            outputs.append(res.stdout)
        for i, code in enumerate(pys):
            exec(compile(swap(code), f"README serve block {i + 1}", "exec"), {"__name__": "__readme__"})
        if while_up is not None:
            while_up(f"http://127.0.0.1:{free}")
        os.kill(run.pid, signal.SIGTERM)
        stopped = True
        res = server().wait(run, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        assert session is not None and not session_settles(session), "the server's Ray instance outlived it"
    finally:
        if not stopped:
            os.kill(run.pid, signal.SIGTERM)
            server().wait(run, timeout=120)
    return outputs


def serve_pages() -> list[Path]:
    return [p for p in pages() if serve_section(p.read_text(encoding="utf-8")) is not None]


@pytest.mark.parametrize("page", serve_pages(), ids=page_name)
def test_the_serve_sections(page, tmp_path):
    """A page's ``posfair serve`` section as written: its server, its curl commands and openai block against it.

    The section's server runs without ``--truncate`` (the module server of tests/serve runs with it), so the
    over-limit refusal is checked over HTTP here: a text over the token limit gets 400 in OpenAI's error shape."""

    def over_the_limit(base: str) -> None:
        import json
        import urllib.error
        import urllib.request

        body = json.dumps({"model": "bundled", "input": ["short", "word " * 2000]}).encode()
        request = urllib.request.Request(f"{base}/v1/embeddings", body, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400 and "X-Posfair-Truncated" not in refused.value.headers
        error = json.loads(refused.value.read())["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input", error
        assert set(error) == {"message", "type", "param", "code"}

    run_serve_section(page.read_text(encoding="utf-8"), tmp_path, while_up=over_the_limit)


def test_the_readme_and_a_guide_each_have_a_serve_section():
    assert [page_name(p) for p in serve_pages()] == ["README.md", "docs/guides/serving.md"]


def test_every_extra_is_named_where_a_user_reads_the_extras():
    """Issue 57: the README's list of extras left out ``serve``.  Every optional-dependency group of pyproject.toml
    is named in the README's install section and in the extras table of docs/getting-started.md."""
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    )
    readme = README.read_text(encoding="utf-8")
    install = readme[readme.index("## Install") : readme.index("\n## ", readme.index("## Install") + 3)]
    table = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    table = table[table.index("### Extras") :]
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))
    assert rows == extras, sorted(rows ^ extras)
    named = set(re.findall(r"`([a-z0-9-]+)`", install))
    assert extras - {"dev"} <= named, sorted(extras - named)
