"""The embedding cache: reuse, resume after a crash, no partial shards, metadata guard."""

from __future__ import annotations

import numpy as np
import pytest

from posfair.store import EmbeddingStore, text_key


def fake_encode(items):
    return np.array([[len(t), sum(map(ord, t)) % 97, 1.0] for t in items], dtype=np.float32)


def test_computes_once_and_reuses(tmp_path):
    calls = []

    def compute(items):
        calls.append(list(items))
        return fake_encode(items)

    texts = ["a", "bb", "a", "ccc"]
    ns = EmbeddingStore(tmp_path).namespace(model="m", calibration=None)
    out = ns.get_or_compute([text_key(t) for t in texts], texts, compute, chunk_size=2)
    np.testing.assert_array_equal(out, fake_encode(texts))
    assert sum(len(c) for c in calls) == 3  # the duplicate "a" computed once
    calls.clear()
    again = EmbeddingStore(tmp_path).namespace(model="m", calibration=None)  # a new process
    np.testing.assert_array_equal(again.get_or_compute([text_key(t) for t in texts], texts, compute), out)
    assert calls == []


def test_resume_after_crash_gives_identical_result(tmp_path):
    texts = [f"text {i}" for i in range(10)]
    keys = [text_key(t) for t in texts]
    done = []

    def crashing(items):
        if len(done) == 2:
            raise KeyboardInterrupt("killed")
        done.append(len(items))
        return fake_encode(items)

    ns = EmbeddingStore(tmp_path).namespace(model="m")
    with pytest.raises(KeyboardInterrupt):
        ns.get_or_compute(keys, texts, crashing, chunk_size=3)
    # a half-written temporary file from the kill must not be read as a shard
    (ns.path / ".part-dead.npz.123.tmp").write_bytes(b"garbage")
    fresh = EmbeddingStore(tmp_path).namespace(model="m")
    assert len(fresh) == 6
    computed = []
    out = fresh.get_or_compute(keys, texts, lambda it: computed.append(len(it)) or fake_encode(it), chunk_size=3)
    assert sum(computed) == 4
    np.testing.assert_array_equal(out, fake_encode(texts))


def test_namespaces_are_separate_and_metadata_is_checked(tmp_path):
    store = EmbeddingStore(tmp_path)
    a = store.namespace(model="m", calibration="x")
    b = store.namespace(model="m", calibration="y")
    a.put(["k"], np.ones((1, 3)))
    assert "k" in a and "k" not in b
    (b.path / "meta.json").write_text('{"model": "other"}')
    with pytest.raises(ValueError, match="different metadata"):
        EmbeddingStore(tmp_path).namespace(model="m", calibration="y")


def test_no_pickle_in_shards(tmp_path):
    ns = EmbeddingStore(tmp_path).namespace(model="m")
    ns.put(["k1", "k2"], np.eye(2))
    shard = next(ns.path.glob("part-*.npz"))
    with np.load(shard, allow_pickle=False) as z:
        assert z["keys"].dtype.kind == "U" and z["vectors"].dtype == np.float32
