"""The Arrow store: shards other tools read, memory-mapped vectors, the key index, the checksum rule,
resume after a kill, streaming search."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from posfair.store import INDEX, DamagedShardWarning, EmbeddingStore, read_shard, text_key


def vectors_for(keys, dim=8):
    """Deterministic vectors of keys (any key gives the same vector in any run)."""
    return np.stack(
        [np.random.default_rng(int(k[:8], 16) if len(k) >= 8 else len(k)).standard_normal(dim) for k in keys]
    ).astype(np.float32)


def filled(root, n=200, shard=32, meta=None):
    keys = [text_key(f"t{i}") for i in range(n)]
    ns = EmbeddingStore(root).namespace(**(meta or {"model": "m"}))
    ns.get_or_compute(keys, keys, vectors_for, chunk_size=shard)
    return ns, keys


def test_round_trip_and_lookups_agree_with_a_dict(tmp_path):
    ns, keys = filled(tmp_path)
    want = dict(zip(keys, vectors_for(keys), strict=True))
    again = EmbeddingStore(tmp_path).namespace(model="m")  # a new process: the index file is used
    assert (again.path / INDEX).exists() and len(again) == len(keys)
    rng = np.random.default_rng(0)
    pick = [keys[i] for i in rng.integers(0, len(keys), 500)]  # repeats included
    np.testing.assert_array_equal(again.get(pick), np.stack([want[k] for k in pick]))
    assert again.missing(["nope", keys[3], "nope", "other"]) == ["nope", "other"]
    assert keys[5] in again and "nope" not in again
    with pytest.raises(KeyError, match="1 keys are not in the store"):
        again.get([keys[0], "nope"])
    # keys added later (this process's dict) and after the next open (the index) agree too
    extra = [f"extra-{i}" for i in range(40)]
    again.put(extra, np.ones((40, 8)))
    assert again.missing(extra) == [] and len(again) == len(keys) + 40
    again.flush()
    third = EmbeddingStore(tmp_path).namespace(model="m")
    assert len(third) == len(keys) + 40 and third.missing(extra + keys) == []


def test_the_same_key_in_two_shards_counts_once_and_the_first_shard_wins(tmp_path):
    ns = EmbeddingStore(tmp_path).namespace(model="m")
    ns.put(["a", "b"], np.zeros((2, 3)), name="a1")
    ns.put(["b", "c"], np.ones((2, 3)), name="b2")
    for opened in (ns, EmbeddingStore(tmp_path).namespace(model="m")):
        assert len(opened) == 3
        np.testing.assert_array_equal(opened.get(["b", "c"]), [[0, 0, 0], [1, 1, 1]])


def test_hash_collisions_are_resolved_by_the_stored_key(tmp_path, monkeypatch):
    import posfair.store.keyindex as ki

    monkeypatch.setattr(ki, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))  # every key collides
    ns, keys = filled(tmp_path, n=50, shard=16)
    again = EmbeddingStore(tmp_path).namespace(model="m")
    np.testing.assert_array_equal(again.get(keys[::-1]), vectors_for(keys[::-1]))
    assert again.missing(["x", keys[0]]) == ["x"] and len(again) == 50


def test_pyarrow_pandas_and_datasets_read_a_shard_directly(tmp_path):
    ns, keys = filled(tmp_path, n=40, shard=40)
    (shard,) = ns.path.glob("part-*.arrow")
    table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()
    assert table.column("key").to_pylist() == keys
    np.testing.assert_array_equal(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), vectors_for(keys))
    meta = json.loads(table.schema.metadata[b"posfair"])
    assert meta["rows"] == 40 and meta["dim"] == 8 and len(meta["sha256"]) == 64
    df = pd.read_feather(shard)
    assert df["key"].tolist() == keys and np.stack(df["vector"]).shape == (40, 8)
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("arrow", data_files=str(shard), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds["key"] == keys
    np.testing.assert_allclose(np.asarray(ds["vector"], dtype=np.float32), vectors_for(keys))


def test_vectors_are_memory_mapped_not_copied(tmp_path):
    ns, keys = filled(tmp_path, n=64, shard=32)
    before = pa.total_allocated_bytes()
    again = EmbeddingStore(tmp_path).namespace(model="m")
    chunks = list(again.chunks())
    assert pa.total_allocated_bytes() == before  # nothing read into Arrow's memory
    for c in chunks:
        assert not c.flags.owndata and not c.flags.writeable  # a view of the file
        assert c.shape == (32, 8)
    stored_keys = again.keys_at(np.arange(64)).tolist()  # shards in name order
    assert sorted(stored_keys) == sorted(keys)
    np.testing.assert_array_equal(np.concatenate(chunks), vectors_for(stored_keys))
    # the vectors and the keys are views into one mapping of the file: their addresses lie within its size
    shard = again.shards.file(0)
    size = shard.path.stat().st_size
    gap = chunks[0].__array_interface__["data"][0] - shard.keys.buffers()[2].address
    assert 0 < gap < size


@pytest.mark.parametrize("kind", ["truncated", "flipped-byte"])
def test_damage_is_detected_renamed_and_recomputed(tmp_path, kind):
    ns, keys = filled(tmp_path, n=96, shard=32)
    victim = sorted(ns.path.glob("part-*.arrow"))[1]
    held = read_shard(victim)[0]
    raw = victim.read_bytes()
    mtime = victim.stat().st_mtime_ns
    if kind == "truncated":
        victim.write_bytes(raw[:-100])
    else:
        at = raw.index(vectors_for(held[-1:]).tobytes())
        victim.write_bytes(raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :])
    if victim.stat().st_mtime_ns == mtime:  # damage happens later than the write (file timestamps are coarse)
        os.utime(victim, ns=(mtime, mtime + 1_000_000_000))
    with pytest.warns(DamagedShardWarning, match=f"damaged cache shard {victim} .*moved to {victim}.damaged-1"):
        again = EmbeddingStore(tmp_path).namespace(model="m")
    assert victim.with_name(victim.name + ".damaged-1").read_bytes() != raw and not victim.exists()
    assert again.missing(keys) == held
    computed = []
    out = again.get_or_compute(keys, keys, lambda it: computed.append(list(it)) or vectors_for(it), chunk_size=32)
    assert computed == [held]
    np.testing.assert_array_equal(out, vectors_for(keys))


def test_damage_that_keeps_size_and_mtime_is_found_by_verify(tmp_path):
    """The rule: a shard the index recorded unchanged (size + mtime) is trusted at open; verify() reads all."""
    ns, keys = filled(tmp_path, n=64, shard=32)
    victim = sorted(ns.path.glob("part-*.arrow"))[0]
    held = read_shard(victim)[0]
    st = victim.stat()
    raw = bytearray(victim.read_bytes())
    at = bytes(raw).index(vectors_for(held[:1]).tobytes())
    raw[at] ^= 0x01
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedShardWarning)
        again = EmbeddingStore(tmp_path).namespace(model="m")  # trusted: not read
    with pytest.warns(DamagedShardWarning, match="checksum mismatch"):
        bad = again.verify()
    assert bad == [victim.with_name(victim.name + ".damaged-1")]
    assert again.missing(keys) == held


def test_a_killed_writer_loses_no_finished_shard(tmp_path):
    """SIGKILL in the middle of a run: every shard written is complete, the run resumes where it was."""
    script = textwrap.dedent(
        """
        import sys, time, numpy as np
        from posfair.store import EmbeddingStore
        ns = EmbeddingStore(sys.argv[1]).namespace(model="m")
        keys = [f"k{i:04d}" for i in range(400)]
        def compute(items):
            print("chunk", flush=True)
            time.sleep(0.05)
            return np.full((len(items), 4), 2.0, dtype=np.float32)
        ns.get_or_compute(keys, keys, compute, chunk_size=10)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(6):
            assert proc.stdout.readline() == "chunk\n"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    ns_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    written = sorted(ns_dir.glob("part-*.arrow"))
    assert 5 <= len(written) <= 7 and not (ns_dir / INDEX).exists()  # killed before the index was written
    for f in written:
        assert read_shard(f)[1].shape == (10, 4)  # complete shards only
    keys = [f"k{i:04d}" for i in range(400)]
    ns = EmbeddingStore(tmp_path).namespace(model="m")  # verifies and indexes the unindexed shards
    assert len(ns) == 10 * len(written) and (ns_dir / INDEX).exists()
    computed = []
    out = ns.get_or_compute(
        keys, keys, lambda it: computed.append(len(it)) or np.full((len(it), 4), 2.0, np.float32), chunk_size=10
    )
    assert sum(computed) == 400 - 10 * len(written) and out.shape == (400, 4)


def test_streaming_search_equals_the_in_memory_search(tmp_path):
    from posfair.retrieval.search import exact_topk, stored_topk

    ns, keys = filled(tmp_path, n=300, shard=64)
    docs = vectors_for(keys)
    q = np.random.default_rng(3).standard_normal((7, 8)).astype(np.float32)
    want_i, want_s = exact_topk(q, docs, k=12, doc_chunk=50)
    got_keys, got_s = stored_topk(q, ns, k=12)
    assert got_keys.tolist() == [[keys[i] for i in row] for row in want_i]
    np.testing.assert_allclose(got_s, want_s, rtol=1e-6)
    if importlib.util.find_spec("faiss") is not None:
        f_keys, _ = stored_topk(q, ns, k=12, use_faiss=True)
        assert f_keys[:, 0].tolist() == got_keys[:, 0].tolist()
    with pytest.warns(UserWarning, match="streaming exact search instead of FAISS"):
        big_keys, _ = stored_topk(q, ns, k=12, use_faiss=True, faiss_max_bytes=10)
    assert big_keys.tolist() == got_keys.tolist()


def test_a_long_run_merges_its_new_keys_into_the_index_as_it_goes(tmp_path, monkeypatch):
    import posfair.store.keyindex as ki

    monkeypatch.setattr(ki, "RECENT_LIMIT", 25)
    ns = EmbeddingStore(tmp_path).namespace(model="m")
    keys = [f"k{i}" for i in range(100)]
    for start in range(0, 100, 10):
        ns.put(keys[start : start + 10], vectors_for(keys[start : start + 10]))
        assert len(ns.shards._recent) < 25 and len(ns) == start + 10
    np.testing.assert_array_equal(ns.get(keys[::-1]), vectors_for(keys[::-1]))
    assert (ns.path / INDEX).exists()


def test_a_trusted_shard_damaged_before_its_first_read_is_recomputed_in_the_same_call(tmp_path):
    """The index trusts a shard (size + mtime unchanged) whose structure is broken: the call that first
    reads it sets it aside, scans the namespace again and computes its keys, instead of failing."""
    ns, keys = filled(tmp_path, n=96, shard=32)
    victim = sorted(ns.path.glob("part-*.arrow"))[1]
    held = read_shard(victim)[0]
    st = victim.stat()
    raw = victim.read_bytes()
    victim.write_bytes(b"\0" * len(raw))  # same size, not an Arrow file any more
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedShardWarning)
        again = EmbeddingStore(tmp_path).namespace(model="m")  # trusted at open: not read
    computed = []
    with pytest.warns(DamagedShardWarning, match=f"damaged cache shard {victim} "):
        out = again.get_or_compute(keys, keys, lambda it: computed.append(list(it)) or vectors_for(it), chunk_size=32)
    assert computed == [held]
    np.testing.assert_array_equal(out, vectors_for(keys))
    assert victim.with_name(victim.name + ".damaged-1").read_bytes() == b"\0" * len(raw)


def test_a_key_stored_twice_is_searched_once(tmp_path):
    """Duplicate keys across shards (two writers computed the same text): search returns each key once,
    as an in-memory search over the distinct vectors does."""
    from posfair.retrieval.search import exact_topk, stored_topk

    ns, keys = filled(tmp_path, n=120, shard=40)
    dup = keys[5:65:3]  # 20 keys written again, in a later shard, with the same vectors
    ns.put(dup, vectors_for(dup))
    ns.flush()
    assert ns.shards.rows == 140 and len(ns) == 120 and len(ns.shards.redundant_rows()) == 20
    q = np.random.default_rng(4).standard_normal((9, 8)).astype(np.float32)
    want_i, want_s = exact_topk(q, vectors_for(keys), k=15)
    for faiss in (False, True) if importlib.util.find_spec("faiss") else (False,):
        got_keys, got_s = stored_topk(q, ns, k=15, use_faiss=faiss)
        assert all(len(set(row)) == 15 for row in got_keys.tolist())
        assert got_keys.tolist() == [[keys[i] for i in row] for row in want_i]
        np.testing.assert_allclose(got_s, want_s, rtol=1e-5)
    # asking for more than the distinct keys: every distinct key once, nothing padded
    all_keys, _ = stored_topk(q[:1], ns, k=500)
    assert sorted(all_keys[0].tolist()) == sorted(keys)


def test_verify_command_sets_damaged_shards_aside_and_says_so(tmp_path):
    from typer.testing import CliRunner

    from posfair.cli import app

    ns, keys = filled(tmp_path / "store", n=64, shard=32)
    runner = CliRunner()
    good = runner.invoke(app, ["verify", str(tmp_path / "store")])
    assert good.exit_code == 0, good.output
    assert "all 2 shards of 1 namespace verified (64 rows)" in good.output
    victim = sorted(ns.path.glob("part-*.arrow"))[0]
    st = victim.stat()
    raw = bytearray(victim.read_bytes())
    held = read_shard(victim)[0]
    raw[bytes(raw).index(vectors_for(held[:1]).tobytes())] ^= 0x01  # size and mtime kept: only a full read sees it
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    bad = runner.invoke(app, ["verify", str(ns.path)])  # one namespace folder works too
    assert bad.exit_code == 1, bad.output
    assert f"set aside: {victim}.damaged-1" in bad.output and "1 damaged shard set aside" in bad.output
    assert not victim.exists() and EmbeddingStore(tmp_path / "store").namespace(model="m").missing(keys) == held
