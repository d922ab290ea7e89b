"""The order the suite hands its scopes to the two xdist workers (tests/conftest.py sorts the collection by it)."""

from __future__ import annotations

#: the longest scopes (a README chain class, or a module run whole on one worker), longest first: collected first,
#: so the two workers start on them and the short scopes fill in after, instead of a long one starting last (the
#: order holds because pyproject.toml's addopts pass --no-loadscope-reorder; xdist's default would sort the scopes
#: by their number of tests, which puts a one-test README chain such as the demo at the end)
LONG_FIRST = (
    "tests/test_readme.py::TestReadmeChain0",  # the demo, the README's first command: ~4.5 min at one thread
    "tests/distributed/test_ray.py",
    "tests/test_readme.py",  # the other README chains and blocks (the serve section's server among them)
    "tests/serve/test_server.py",  # one real Ray Serve server for the module: ~85 s
    "tests/serve/test_server_faults.py",  # two servers, each broken (Ray killed, the process group stopped): ~2 min
    "tests/serve/test_serve_run.py",  # Serve's own `serve run` of the builder: ~40 s
    "tests/test_bundled_e5.py",
    "tests/test_faults.py",
)


def scope_rank(nodeid: str) -> int:
    """Where a test's scope stands in :data:`LONG_FIRST` (its length when not there)."""
    for rank, prefix in enumerate(LONG_FIRST):
        if nodeid.startswith(prefix) and nodeid[len(prefix) : len(prefix) + 2] in ("::", ""):
            return rank
    return len(LONG_FIRST)
