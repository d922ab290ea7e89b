"""Fixtures for the fallback backend: tiny remote-code models (tests/remote_code_models.py)."""

from __future__ import annotations

import pytest

import posfair
from remote_code_models import build_remote_model


@pytest.fixture(scope="session")
def remote_model_path(tmp_path_factory):
    """Factory: attention kind -> folder of a seeded tiny remote-code model (built once per session)."""
    cache = {}

    def make(kind: str):
        if kind not in cache:
            cache[kind] = build_remote_model(tmp_path_factory.mktemp(f"remote-{kind}"), kind)
        return cache[kind]

    return make


@pytest.fixture(scope="session")
def remote_model(remote_model_path):
    """Factory: (attention kind, pooling) -> a loaded FairModel, as users load remote code
    (cached per session; do not mutate it: no default calibration, no lasting hooks)."""

    cache = {}

    def make(kind: str, pooling: str = "cls"):
        if (kind, pooling) not in cache:
            cache[kind, pooling] = posfair.load_model(remote_model_path(kind), trust_remote_code=True, pooling=pooling)
        return cache[kind, pooling]

    return make
