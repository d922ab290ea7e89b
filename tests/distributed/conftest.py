"""Fixtures of the distributed tests: a small corpus, the tiny model's spec, one local Ray instance."""

from __future__ import annotations

import pytest

from posfair.corpus import load_corpus
from posfair.distributed import EmbedSpec

MAX_LEN = 64


@pytest.fixture(scope="session")
def texts():
    """60 bundled-corpus texts cut to varied lengths (about 5 to 150 tokens), plus two duplicates."""
    df = load_corpus(langs=["en", "de"])
    picked = []
    for i, t in enumerate(df.text.tolist()[:60]):
        words = t.split()
        picked.append(" ".join(words[: 3 + (i * 37) % 110]))
    return picked + picked[:2]


@pytest.fixture(scope="session")
def tiny_spec(tiny_model_path):
    """Factory: EmbedSpec of the tiny seeded BERT (CLS pooling), with keyword overrides."""
    path, pooling = tiny_model_path("bert")

    def make(**kw):
        base = dict(model=str(path), pooling=pooling, max_seq_length=MAX_LEN, batch_size=8, max_batch_tokens=256)
        return EmbedSpec(**{**base, **kw})

    return make


@pytest.fixture(scope="session")
def tiny_fair(tiny_spec):
    """The tiny model as loaded from the spec (shared; never given a default calibration)."""
    return tiny_spec().load_model()


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance with 2 CPUs for a test module (Ray is a dev dependency: no skip).  Ended with the
    module: an idle instance's servers and agents take ~6 % of a core, which the rest of the suite needs."""
    import ray
    import ray.data  # noqa: F401

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
