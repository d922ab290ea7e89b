"""The store under the operating system's limits: more shards than open files, and errors of the machine
(too many open files, permission, I/O) told apart from damaged bytes (issue 38, item 2)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from forked import run_forked
from posfair.cli import app
from posfair.runtime.errors import PosfairReadError
from posfair.store import DamagedShardWarning, EmbeddingStore, text_key, verify_store

DIM = 4


def vectors(ids) -> np.ndarray:
    """The vector of key number ``i``: ``10 i + [0, 1, 2, 3]`` (any run, any process)."""
    return (10.0 * np.asarray(ids, dtype=np.float32)[:, None] + np.arange(DIM, dtype=np.float32)).astype(np.float32)


def filled(root, shards: int, per: int = 2):
    """A namespace of ``shards`` shards of ``per`` keys each; key ``i`` is ``text_key(f"t{i}")``."""
    ns = EmbeddingStore(root).namespace(model="m")
    for s in range(shards):
        ids = list(range(s * per, (s + 1) * per))
        ns.put([text_key(f"t{i}") for i in ids], vectors(ids))
    ns.flush()
    return ns


def damaged(root) -> list[str]:
    return sorted(p.name for p in root.rglob("*.damaged-*"))


# a fresh process with a low open-file limit (and at most 8 shards kept mapped, to exercise the bound): verify the
# store, look up keys spread over every shard, stream every shard; the results go to .npy files for the test to check
CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, warnings
    import numpy as np

    root, limit, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from posfair.store import EmbeddingStore, keyindex, text_key, verify_store

    keyindex.MAPPED_SHARDS = 8

    def shard_maps():
        with open("/proc/self/maps") as fh:
            return len({line.split()[-1] for line in fh if line.rstrip().endswith(".arrow") and "/part-" in line})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = verify_store(root)
        ns = EmbeddingStore(root).namespace(model="m")
        order = np.random.default_rng(0).permutation(n)
        got = ns.get([text_key(f"t{i}") for i in order])
        chunks = list(ns.chunks())  # views of every shard, held while the set drops all but 8
        streamed = np.concatenate(chunks)
        keys = ns.keys_at(np.arange(n)).tolist()
        held = shard_maps()
        del chunks
        after = shard_maps()
    np.save(os.path.join(root, "..", "got.npy"), got)
    np.save(os.path.join(root, "..", "order.npy"), order)
    np.save(os.path.join(root, "..", "streamed.npy"), streamed)
    print(json.dumps({"report": report, "warnings": [str(w.message) for w in caught], "keys": keys,
                      "fds": len(os.listdir("/proc/self/fd")), "held": held, "after": after}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory maps in /proc")
def test_more_shards_than_open_files_verify_and_look_up_with_nothing_set_aside(tmp_path):
    """200 shards, a process allowed 64 open files: ``verify_store``, lookups of keys in every shard and a
    stream of every shard all succeed and agree with the vectors written; no shard is set aside; at most
    8 shards stay mapped once no array of theirs is held (the arrays handed out stay valid after)."""
    shards, per = 200, 2
    n = shards * per
    root = tmp_path / "store"
    filled(root, shards, per)
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), "64", str(n)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    (rec,) = out["report"]
    assert (rec["shards"], rec["rows"], rec["keys"], rec["damaged"], rec["error"]) == (shards, n, n, [], None)
    assert damaged(root) == [] and not [w for w in out["warnings"] if "damaged" in w], out["warnings"]
    order = np.load(tmp_path / "order.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), vectors(order))
    ids = [
        int(k) for k in (np.array(out["keys"])[:, None] == np.array([text_key(f"t{i}") for i in range(n)])).argmax(1)
    ]
    assert sorted(ids) == list(range(n))  # keys_at names every key once
    np.testing.assert_array_equal(np.load(tmp_path / "streamed.npy"), vectors(ids))  # rows in shard order
    assert out["fds"] < 64
    assert out["held"] == shards  # the streamed views kept their shards mapped while held ...
    assert out["after"] <= 8  # ... and the set keeps at most MAPPED_SHARDS once they are dropped


@pytest.fixture
def failing_open(monkeypatch):
    """``failing_open(code)``: from now on, mapping a shard file fails with the operating system's error ``code``."""

    def install(code: int):
        real = pa.memory_map

        def memory_map(path, *args, **kwargs):
            if os.path.basename(str(path)).startswith("part-"):
                raise OSError(code, os.strerror(code))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(pa, "memory_map", memory_map)

    return install


@pytest.mark.parametrize(
    "code,cause",
    [
        (errno.EMFILE, "too many open files: this process reached its open-file limit (ulimit -n: "),
        (errno.ENFILE, "too many open files in the system"),
        (errno.EACCES, "permission denied"),
        (errno.EIO, "input/output error"),
        (errno.ENOMEM, "out of memory"),
    ],
)
def test_verify_reports_an_os_error_on_a_shard_and_sets_nothing_aside(tmp_path, failing_open, code, cause):
    root = tmp_path / "store"
    filled(root, 3)
    before = sorted(p.name for p in root.rglob("*"))
    failing_open(code)
    with pytest.raises(PosfairReadError) as err:
        verify_store(root)
    assert err.value.errno == code and str(err.value).startswith("cannot read ") and cause in str(err.value)
    r = CliRunner().invoke(app, ["verify", str(root)])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read ") and cause in lines[0], r.stderr
    shard = lines[0].split()[3].rstrip(":")
    assert os.path.basename(shard).startswith("part-") and os.path.exists(shard)  # names the file, which stays
    if code == errno.EMFILE:
        assert "ulimit -n" in lines[0]
    assert sorted(p.name for p in root.rglob("*")) == before  # nothing renamed, nothing written


def test_lookups_and_a_first_open_report_an_os_error_and_set_nothing_aside(tmp_path, failing_open):
    """A shard the index trusts, mapped only when a lookup needs it, and a namespace opened without an index
    (every shard checked): an I/O error is raised naming the shard; no shard is set aside or recomputed."""
    root = tmp_path / "store"
    filled(root, 3)
    keys = [text_key(f"t{i}") for i in range(6)]
    ns = EmbeddingStore(root).namespace(model="m")  # trusted by the index: no shard mapped yet
    before = sorted(p.name for p in root.rglob("*"))
    failing_open(errno.EIO)
    with pytest.raises(PosfairReadError, match=r"cannot read .*part-.*\.arrow: input/output error"):
        ns.get(keys)
    with pytest.raises(PosfairReadError):
        ns.get_or_compute(keys, keys, lambda items: pytest.fail(f"recomputed {len(items)} stored keys"))
    assert sorted(p.name for p in root.rglob("*")) == before
    (ns.path / "index.arrow").unlink()
    with pytest.raises(PosfairReadError):
        EmbeddingStore(root).namespace(model="m")
    assert damaged(root) == []


def test_bytes_arrow_reports_as_an_oserror_without_errno_are_still_damage(tmp_path):
    """Arrow reports some damaged bytes (a garbled footer) as an OSError without an errno: that shard is damaged,
    set aside with a warning, as before."""
    root = tmp_path / "store"
    ns = filled(root, 3)
    victim = sorted(ns.path.glob("part-*.arrow"))[1]
    raw = victim.read_bytes()
    footer = int.from_bytes(raw[-10:-6], "little")
    bad = raw[: -10 - footer] + b"\xff" * footer + raw[-10:]
    with pytest.raises(OSError) as err:  # the premise: Arrow's complaint is an OSError with no errno
        pa.ipc.open_file(pa.py_buffer(bad))
    assert err.value.errno is None and not isinstance(err.value, pa.ArrowInvalid)
    victim.write_bytes(bad)
    with pytest.warns(DamagedShardWarning, match="not a complete Arrow IPC file"):
        (rec,) = verify_store(root)
    assert rec["damaged"] == [f"{victim}.damaged-1"] and rec["shards"] == 2


def test_encode_of_one_text_per_shard_under_a_low_open_file_limit(tmp_path, tiny_model_path):
    """``posfair encode --chunk-size 1`` of 60 texts with ``ulimit -n 40``, then the same run again (every
    vector read from the 60 shards): both succeed, nothing set aside, the same vectors as a run without a cache."""
    path, pooling = tiny_model_path("bert")
    (tmp_path / "in.txt").write_text("\n".join(f"text number {i} about packages" for i in range(60)) + "\n")
    base = ["encode", "-i", str(tmp_path / "in.txt"), "--chunk-size", "1", "--model", str(path), "--pooling", pooling]
    cache = ["--cache", str(tmp_path / "cache")]
    assert CliRunner().invoke(app, [*base, "-o", str(tmp_path / "clean.npy")]).exit_code == 0
    for name in ("first.npy", "rerun.npy"):
        res = run_forked([*base, *cache, "-o", str(tmp_path / name)], tmp_path, nofile=40)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "damaged" not in res.stderr, res.stderr
        np.testing.assert_array_equal(np.load(tmp_path / name), np.load(tmp_path / "clean.npy"))
    assert len(list((tmp_path / "cache").glob("*/part-*.arrow"))) == 60 and damaged(tmp_path / "cache") == []
