"""The embedding cache: reuse, resume after a crash, no partial shards, metadata guard."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
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
    (ns.path / ".part-dead.arrow.123.tmp").write_bytes(b"garbage")
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
    shard = next(ns.path.glob("part-*.arrow"))
    table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()  # plain Arrow: a key string column, float32 vectors
    assert table.schema.field("key").type == pa.string() and table.schema.field("vector").type == pa.list_(
        pa.float32(), 2
    )


# ---------------------------------------------------------------------------------------------
# checksums, damaged shards, the manifest

import json  # noqa: E402
import os  # noqa: E402
import warnings  # noqa: E402

from posfair.encoding import encode_cached  # noqa: E402
from posfair.store import (  # noqa: E402
    MANIFEST,
    DamagedShardWarning,
    ManifestMismatch,
    code_version,
    read_shard,
    write_shard,
)
from posfair.store.shards import _checksum  # noqa: E402

TEXTS = [f"text number {i}" for i in range(9)]
KEYS = [text_key(t) for t in TEXTS]


def filled(root, chunk_size=3):
    """A namespace holding TEXTS in shards of ``chunk_size``; returns (namespace, shard files in order)."""
    ns = EmbeddingStore(root).namespace(model="m", calibration="stock")
    ns.get_or_compute(KEYS, TEXTS, fake_encode, chunk_size=chunk_size)
    return ns, sorted(ns.path.glob("part-*.arrow"))


def rewrite(path, keys, vectors, meta=None):
    """Write an Arrow shard by hand (``meta``: the posfair metadata, None = none)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    metadata = {b"posfair": json.dumps(meta).encode()} if meta is not None else None
    batch = pa.record_batch(
        [
            pa.array(list(keys), pa.string()),
            pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1]),
        ],
        schema=pa.schema(
            [pa.field("key", pa.string()), pa.field("vector", pa.list_(pa.float32(), vectors.shape[1]))],
            metadata=metadata,
        ),
    )
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
        w.write_batch(batch)


def later(path, mtime_ns):
    """Damage is found later than the write: make sure the mtime moved (file timestamps are coarse)."""
    if path.stat().st_mtime_ns == mtime_ns:
        os.utime(path, ns=(mtime_ns, mtime_ns + 1_000_000_000))


def damage(kind, path):
    keys, vectors, meta = read_shard(path)
    keys, vectors = list(keys), np.array(vectors)
    raw = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "zero-byte":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b"this is not a shard " * 20)
    elif kind == "flipped-byte":  # one byte of the vectors flipped in place: the checksum catches it
        at = raw.rindex(vectors.tobytes()[-8:])
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :])
    elif kind == "altered":  # vectors changed after writing: the checksum no longer matches
        rewrite(path, keys, vectors + 1, meta)
    elif kind == "nan":  # NaN written with a consistent checksum: caught by the finiteness check
        bad = vectors.copy()
        bad[1, 0] = np.nan
        info = {k: v for k, v in meta.items() if k != "sha256"}
        rewrite(path, keys, bad, {**info, "sha256": _checksum(info, keys, bad)})
    elif kind == "wrong-shape":
        rewrite(path, keys[:2], vectors[:2], meta)
    elif kind == "wrong-dim":
        rewrite(path, keys, vectors[:, :2], meta)
    elif kind == "no-checksum":  # a shard of another program
        rewrite(path, keys, vectors)
    else:
        raise AssertionError(kind)
    later(path, mtime)


# the reason named in the warning (the unreadable ones end with the exception's own text)
REASONS = {
    "truncated": ("not a complete Arrow IPC file: ", True),
    "zero-byte": ("empty file: 0 bytes", False),
    "garbage": ("not a complete Arrow IPC file: 400 bytes, cut short or overwritten", False),
    "flipped-byte": ("checksum mismatch", False),
    "altered": ("checksum mismatch", False),
    "nan": ("1 NaN or infinite values", False),
    "wrong-shape": ("it holds 2 keys and vectors of shape (2, 3), but its metadata says 3 x 3", False),
    "wrong-dim": (
        "its columns are (key: string, vector: fixed_size_list<item: float>[2]), not key (string) and vector (fixed_size_list<float>[3])",
        False,
    ),  # fmt: skip
    "no-checksum": ("it has no checksum (written by an older posfair or another program)", False),
}


@pytest.mark.parametrize("kind", list(REASONS))
def test_a_damaged_shard_is_set_aside_named_and_recomputed(tmp_path, kind):
    clean, _ = filled(tmp_path / "clean")
    want = clean.get(KEYS)
    _, shards = filled(tmp_path / "s")
    victim = shards[1]
    held = read_shard(victim)[0]
    damage(kind, victim)
    damaged_bytes = victim.read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns = EmbeddingStore(tmp_path / "s").namespace(model="m", calibration="stock")
    moved = victim.with_name(victim.name + ".damaged-1")
    reason, open_ended = REASONS[kind]
    pattern = f"damaged cache shard {re.escape(str(victim))} \\({re.escape(reason)}{'.*' if open_ended else ''}\\): moved to {re.escape(str(moved))}; its vectors are recomputed"
    messages = [str(w.message) for w in caught if w.category is DamagedShardWarning]
    assert len(messages) == 1 and re.fullmatch(pattern, messages[0]), messages
    assert moved.read_bytes() == damaged_bytes and not victim.exists()  # set aside, not deleted
    assert len(ns) == 6
    computed = []
    got = ns.get_or_compute(KEYS, TEXTS, lambda items: computed.append(list(items)) or fake_encode(items), chunk_size=3)
    assert [[text_key(t) for t in c] for c in computed] == [held]  # exactly the damaged shard's texts
    np.testing.assert_array_equal(got, want)  # equal to a clean run, bit for bit
    # the rerun finds a healthy store: no warning, nothing computed
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedShardWarning)
        again = EmbeddingStore(tmp_path / "s").namespace(model="m", calibration="stock")
    np.testing.assert_array_equal(again.get(KEYS), want)


def test_a_second_damage_gets_the_next_free_name(tmp_path):
    shard = EmbeddingStore(tmp_path).namespace(model="m").path / "part-fixed.arrow"
    for n in (1, 2, 3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ns = EmbeddingStore(tmp_path).namespace(model="m")
        assert [str(w.message).rsplit("/", 1)[-1] for w in caught] == (
            [f"part-fixed.arrow.damaged-{n - 1}; its vectors are recomputed"] if n > 1 else []
        )
        assert "a" not in ns
        ns.put(["a"], np.ones((1, 2)), name="fixed")
        shard.write_bytes(f"damage {n}".encode())
    assert [(shard.parent / f"part-fixed.arrow.damaged-{n}").read_text() for n in (1, 2)] == ["damage 1", "damage 2"]


def test_every_shard_carries_a_checksum_over_keys_vectors_and_settings(tmp_path):
    _, shards = filled(tmp_path)
    keys, vectors, meta = read_shard(shards[0])
    texts = [TEXTS[KEYS.index(k)] for k in keys]
    assert len(texts) == 3
    np.testing.assert_array_equal(vectors, fake_encode(texts))
    assert meta["rows"] == 3 and meta["dim"] == 3 and len(meta["sha256"]) == 64
    assert meta["settings"] == {"namespace": {"calibration": "stock", "model": "m"}, **code_version()}


def test_nan_vectors_are_never_cached(tmp_path):
    ns = EmbeddingStore(tmp_path).namespace(model="m")
    bad = np.ones((3, 2), dtype=np.float32)
    bad[2, 1] = np.inf
    with pytest.raises(
        ValueError,
        match="^1 of 3 vectors hold NaN or infinite values \\(first: row 2, key c\\); refusing to cache them$",
    ):
        ns.put(["a", "b", "c"], bad)
    assert not list(ns.path.glob("part-*")) and len(ns) == 0
    ns.put(["a"], np.ones((1, 2)))
    with pytest.raises(ValueError, match="holds vectors of 2 dimensions; refusing to add vectors of 5"):
        ns.put(["b"], np.ones((1, 5)))


def test_a_missing_manifest_is_rebuilt_from_the_shards(tmp_path):
    ns, _ = filled(tmp_path)
    manifest_file = ns.path / MANIFEST
    original = json.loads(manifest_file.read_text())
    assert original == {"format": 2, "namespace": {"calibration": "stock", "model": "m"}, "dim": 3, **code_version()}
    manifest_file.unlink()
    with pytest.warns(
        UserWarning,
        match=f"^store {ns.path} had no readable manifest.json: rebuilt it from the metadata of its 3 shards$",
    ):
        again = EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")
    assert json.loads(manifest_file.read_text()) == original and len(again) == 9
    # a garbage manifest is set aside (kept) and rebuilt the same way
    manifest_file.write_text("{not json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")
    assert [str(w.message) for w in caught] == [
        f"damaged store manifest {manifest_file} (not readable: Expecting property name enclosed in double quotes: line 1 column 2 "
        f"(char 1)): moved to {manifest_file}.damaged-1; it is rebuilt from the shards",
        f"store {ns.path} had no readable manifest.json: rebuilt it from the metadata of its 3 shards",
    ]
    assert json.loads(manifest_file.read_text()) == original
    assert (ns.path / "manifest.json.damaged-1").read_text() == "{not json"


def test_a_manifest_of_other_settings_is_refused_by_name(tmp_path):
    ns, shards = filled(tmp_path)
    manifest_file = ns.path / MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "code_hash": "0" * 16}))
    here = code_version()["code_hash"]
    with pytest.raises(ManifestMismatch) as err:
        EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")
    assert str(err.value) == (
        f"store {ns.path} was made with other settings (code_hash: the store has '0000000000000000', this run has "
        f"'{here}'): refusing to mix them; use another store folder, or delete {ns.path} to recompute it"
    )
    assert sorted(ns.path.glob("part-*.arrow")) == shards  # nothing touched
    # with the manifest gone, the shards' own metadata gives the same answer
    manifest_file.unlink()
    keys, vectors, _ = read_shard(shards[0])
    write_shard(
        ns.path,
        keys,
        vectors,
        name="older",
        settings={"namespace": ns.meta, "posfair_version": "0.0.1", "code_hash": "0" * 16},
    )
    older = ns.path / "part-older.arrow"
    with pytest.raises(ManifestMismatch) as err:
        EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")
    assert str(err.value) == (
        f"shard {older} was made with other settings (code_hash: the store has '{here}', the shard has '0000000000000000'; "
        f"posfair_version: the store has '{code_version()['posfair_version']}', the shard has '0.0.1'): refusing to mix them; "
        f"use another store folder, or delete {ns.path} to recompute it"
    )


def test_a_shard_of_another_namespace_is_refused_by_name(tmp_path):
    ns, _ = filled(tmp_path)
    other = EmbeddingStore(tmp_path).namespace(model="other")
    other.put(["x"], np.ones((1, 3)), name="foreign")
    (other.path / "part-foreign.arrow").rename(ns.path / "part-foreign.arrow")
    with pytest.raises(
        ManifestMismatch, match=f"^shard {ns.path / 'part-foreign.arrow'} was made with other settings \\(namespace: "
    ):
        EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")


def test_refresh_checks_shards_written_by_another_process(tmp_path):
    ns, _ = filled(tmp_path)
    late = EmbeddingStore(tmp_path / "x").namespace(model="m", calibration="stock")  # another "process", same settings
    late.put(["late"], np.ones((1, 3)), name="late")
    (late.path / "part-late.arrow").rename(ns.path / "part-late.arrow")
    (ns.path / "part-broken.arrow").write_bytes(b"\x00" * 10)
    with pytest.warns(DamagedShardWarning, match="part-broken.arrow"):
        ns.refresh()
    assert "late" in ns and len(ns) == 10 and (ns.path / "part-broken.arrow.damaged-1").exists()


def test_encode_cached_refuses_non_text_items(tmp_path):
    with pytest.raises(ValueError, match=r"^text 1 is NoneType None, not a string: posfair embeds only texts$"):
        encode_cached(object(), ["fine", None], None)
    with pytest.raises(ValueError, match=r"^text 2 is empty: posfair does not embed empty texts$"):
        encode_cached(object(), np.array(["a", "b", " "]), EmbeddingStore(tmp_path))


def test_unreadable_namespace_metadata_is_set_aside_and_written_again(tmp_path):
    ns, _ = filled(tmp_path)
    meta_file = ns.path / "meta.json"
    meta_file.write_bytes(b"\xff\xfe garbage")
    with pytest.warns(
        DamagedShardWarning,
        match=f"^damaged namespace metadata {meta_file} .*: moved to {meta_file}.damaged-1; it is written again$",
    ):
        again = EmbeddingStore(tmp_path).namespace(model="m", calibration="stock")
    assert json.loads(meta_file.read_text()) == {"calibration": "stock", "model": "m"} and len(again) == 9
    assert (ns.path / "meta.json.damaged-1").read_bytes() == b"\xff\xfe garbage"


def test_a_store_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "store").write_text("not a folder")
    with pytest.raises(ValueError, match=f"^embedding store {tmp_path / 'store'} is a file, not a folder$"):
        EmbeddingStore(tmp_path / "store")
