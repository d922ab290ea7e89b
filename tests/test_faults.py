"""Faults in the store and the input readers: each case reproduces what a fault probe found."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from forked import run_forked, server
from posfair.cli import app

TEXTS = [
    "Debian is a free operating system. " * 6,
    "How do I install a package?",
    "The installer runs in many languages.",
]


def run(*args):
    return CliRunner().invoke(app, list(map(str, args)))


@pytest.fixture
def tiny(tiny_model_path):
    path, pooling = tiny_model_path("bert")
    return ("--model", path, "--pooling", pooling)


@pytest.mark.parametrize("damage", ["lost", "garbage"])
def test_verify_rebuilds_a_manifest_the_next_run_accepts(tmp_path, tiny, damage):
    """Lose (or damage) a namespace's manifest, run ``posfair verify``, encode again into the same cache:
    the rebuilt manifest equals the one the run wrote, and the output equals a clean run's."""
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ("encode", "-i", tmp_path / "in.txt", "--chunk-size", "1", *tiny)
    assert run(*args, "-o", tmp_path / "clean.npy").exit_code == 0
    assert run(*args, "-o", tmp_path / "a.npy", "--cache", tmp_path / "cache").exit_code == 0
    manifest_file = next((tmp_path / "cache").glob("*/manifest.json"))
    original = json.loads(manifest_file.read_text())
    if damage == "lost":
        manifest_file.unlink()
    else:
        manifest_file.write_text("{half a manifest")
    r = run("verify", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    assert json.loads(manifest_file.read_text()) == original
    r = run(*args, "-o", tmp_path / "b.npy", "--cache", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.load(tmp_path / "clean.npy"))


def test_a_manifest_without_its_format_is_set_aside_and_rebuilt(tmp_path, tiny):
    """A store broken by an earlier ``posfair verify`` (a rebuilt manifest without ``format``) is repaired
    on the next run, the old manifest kept beside it."""
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    args = ("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "a.npy", "--cache", tmp_path / "cache", *tiny)
    assert run(*args).exit_code == 0
    manifest_file = next((tmp_path / "cache").glob("*/manifest.json"))
    original = json.loads(manifest_file.read_text())
    broken = {k: v for k, v in original.items() if k != "format"}
    manifest_file.write_text(json.dumps(broken))
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert json.loads(manifest_file.read_text()) == original
    assert json.loads(manifest_file.with_name("manifest.json.damaged-1").read_text()) == broken
    assert f"damaged store manifest {manifest_file} (not readable: it lacks format)" in r.stderr


def test_the_manifest_writer_refuses_an_incomplete_manifest(tmp_path):
    from posfair.store import write_manifest

    with pytest.raises(ValueError, match="without namespace, posfair_version, code_hash"):
        write_manifest(tmp_path, {"dim": 3})
    assert not (tmp_path / "manifest.json").exists()
    written = write_manifest(tmp_path, {"namespace": {"m": 1}, "posfair_version": "1", "code_hash": "x"})
    assert written["format"] == 2 and json.loads((tmp_path / "manifest.json").read_text()) == written


def test_the_truncation_warning_counts_the_input_not_the_cache_misses(tmp_path, tiny_model_path):
    """With a warm cache holding all but the long text, the warning still counts and indexes the user's input."""
    path, pooling = tiny_model_path("bert")
    texts = [f"short text number {i}" for i in range(11)]
    texts[5] = "a long text " * 400
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "warm.txt").write_text("\n".join(t for i, t in enumerate(texts) if i != 5) + "\n")
    base = ("encode", "--model", path, "--pooling", pooling, "--cache", tmp_path / "cache", "--chunk-size", "2")
    assert run(*base, "-i", tmp_path / "warm.txt", "-o", tmp_path / "warm.npy").exit_code == 0
    for _ in range(2):  # the long text missing from the cache, then cached too
        r = run(*base, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.npy")
        assert r.exit_code == 0, r.output
        warned = [line for line in r.stderr.splitlines() if "truncated" in line]
        assert len(warned) == 1 and "1 of 11 texts are longer than" in warned[0] and "(first: text 5," in warned[0], (
            warned
        )


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command loads a model (bad input must be refused before any work)."""
    from posfair.cli import checks

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    "ids,message",
    [
        (
            [1, "a", None],
            "line 2: 'doc' is 'a' but the first id (line 1) is an integer: ids must all be strings or all integers",
        ),
        (
            ["a", 2],
            "line 2: 'doc' is an int (2) but the first id (line 1) is a string: ids must all be strings or all integers",
        ),
        (["a", None], "line 2: 'doc' is null: ids must be strings or integers"),
        ([1.5, 2], "line 1: 'doc' is a float (1.5): ids must be strings or integers"),
        ([1, [2]], "line 2: 'doc' is a list ([2]): ids must be strings or integers"),
        ([True, False], "line 1: 'doc' is a bool (True): ids must be strings or integers"),
    ],
)
def test_ids_of_mixed_or_unusable_types_are_refused_before_any_work(tmp_path, no_model, ids, message):
    path = _jsonl(tmp_path / "in.jsonl", [{"text": f"text {i}", "doc": d} for i, d in enumerate(ids)])
    r = run("encode", "-i", path, "-o", tmp_path / "o.parquet", "--id-field", "doc")
    assert r.exit_code == 2 and r.stderr == f"error: {path}: {message}\n"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["in.jsonl"]


def test_parquet_ids_with_a_null_are_refused_by_row(tmp_path, no_model):
    import pandas as pd

    path = tmp_path / "in.parquet"
    pd.DataFrame({"text": ["a", "b", "c"], "doc": pd.array([1, None, 3], dtype="Int64")}).to_parquet(path)
    r = run("encode", "-i", path, "-o", tmp_path / "o.parquet", "--id-field", "doc")
    assert r.exit_code == 2 and r.stderr == f"error: {path}: row 1: 'doc' is null: ids must be strings or integers\n"


def test_repeated_ids_are_kept_and_counted(tmp_path, tiny):
    import pandas as pd

    path = _jsonl(
        tmp_path / "in.jsonl",
        [{"text": t, "doc": d} for t, d in zip(TEXTS + ["more", "again"], [3, 1, 3, 2, 3], strict=True)],
    )
    r = run("encode", "-i", path, "-o", tmp_path / "o.parquet", "--id-field", "doc", *tiny)
    assert r.exit_code == 0, r.output
    assert f"warning: {path}: 2 of 5 'doc' values repeat an earlier one (first: 3 at line 1 and line 3)" in r.stderr
    assert pd.read_parquet(tmp_path / "o.parquet")["doc"].tolist() == [3, 1, 3, 2, 3]


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl"])
@pytest.mark.parametrize("invisible", ["\x01\x02", "\u200b", "\ufeff", "\u200b \u2028\x7f"])
def test_texts_without_content_are_refused_like_empty_ones(tmp_path, no_model, name, invisible):
    path = tmp_path / name
    if name == "in.txt":
        path.write_text(f"fine\n{invisible}\nalso fine\n")
    else:
        _jsonl(path, [{"text": "fine"}, {"text": invisible}, {"text": "also fine"}])
    r = run("encode", "-i", path, "-o", tmp_path / "o.npy")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {path}: line 2: 'text' is empty (only invisible characters: U+")


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl"])
def test_a_byte_order_mark_is_not_part_of_the_first_text(tmp_path, tiny, name):
    lines = TEXTS if name == "in.txt" else [json.dumps({"text": t}) for t in TEXTS]
    body = "\n".join(lines) + "\n"
    (tmp_path / "plain" / name).parent.mkdir()
    (tmp_path / "plain" / name).write_text(body, encoding="utf-8")
    (tmp_path / "bom" / name).parent.mkdir()
    (tmp_path / "bom" / name).write_text(body, encoding="utf-8-sig")
    assert (tmp_path / "bom" / name).read_bytes()[:3] == b"\xef\xbb\xbf"
    for kind in ("plain", "bom"):
        r = run("encode", "-i", tmp_path / kind / name, "-o", tmp_path / f"{kind}.npy", *tiny)
        assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(np.load(tmp_path / "bom.npy"), np.load(tmp_path / "plain.npy"))


def test_invalid_utf8_is_named_by_line(tmp_path, no_model):
    path = tmp_path / "in.txt"
    path.write_bytes(b"fine\nalso fine\nbad \xff here\n")
    r = run("encode", "-i", path, "-o", tmp_path / "o.npy")
    assert (
        r.exit_code == 2
        and r.stderr == f"error: {path}: line 3 is not UTF-8 text (invalid start byte at byte 5 of the line)\n"
    )


def test_an_empty_model_name_is_refused(tmp_path, no_model):
    (tmp_path / "in.txt").write_text("fine\n")
    r = run("encode", "-i", tmp_path / "in.txt", "-o", tmp_path / "o.npy", "--model", "")
    assert r.exit_code == 2 and r.stderr.startswith("error: --model '': "), r.stderr


def test_an_output_over_a_file_size_limit_is_named_with_its_cause(tmp_path, tiny):
    """Under a file-size limit the output write fails: one line naming the output and the cause, exit 1,
    nothing partial at the output path; the cache stays valid and the same run completes without the limit.
    (The command runs as the ``posfair`` script does, in a process of its own: tests/forked.py.)"""
    texts = [f"text number {i} about installing packages" for i in range(300)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    args = ["encode", "-i", str(tmp_path / "in.txt"), "-o", str(out), "--chunk-size", "50",
            "--cache", str(tmp_path / "cache"), *map(str, tiny)]  # fmt: skip
    limit = 40_000  # the output (300 x 64 float32 = 76,928 bytes) does not fit; a 50-text cache shard does
    res = run_forked(args, tmp_path, fsize=limit)
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write {out}: ") and ("file too large" in last or "cut short" in last), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "in.txt"]  # no partial output, no temporary file
    res = run_forked(args, tmp_path)
    assert res.returncode == 0, res.stderr
    assert np.load(out).shape == (300, 64)


@pytest.mark.parametrize("code,cause", [(28, "no space left on the device"), (30, "the file system is read-only")])
def test_a_failed_write_names_the_path_and_the_cause(tmp_path, code, cause):
    from posfair.files.atomic import atomic_write
    from posfair.runtime.errors import PosfairWriteError

    def full(p):
        p.write_bytes(b"partial")
        raise OSError(code, os.strerror(code))

    import os

    target = tmp_path / "shard.arrow"
    with pytest.raises(PosfairWriteError) as err:
        atomic_write(target, full)
    assert str(err.value) == f"cannot write {target}: {cause}"
    assert list(tmp_path.iterdir()) == []


def test_runs_sharing_a_temporary_cache_leave_nothing_behind(tmp_path):
    """Two runs with the same -o and no --cache: the first to finish leaves the folder to the other,
    which removes it; a run arriving while the folder is being removed starts a fresh one."""
    from posfair.cli.encode import _TEMPORARY_MARK, TemporaryCacheFolder

    out = tmp_path / "out.npy"
    a = TemporaryCacheFolder(out)
    b = TemporaryCacheFolder(out)
    assert a.path == b.path == tmp_path / ".out.npy.posfair-cache"
    (a.path / "shard-of-b").write_text("b is still writing")
    assert a.remove() is False and (b.path / "shard-of-b").exists()  # b holds it: a leaves it
    assert b.remove() is True and not b.path.exists()  # the last one out removes it
    c = TemporaryCacheFolder(out)
    assert c.remove() is True and sorted(tmp_path.iterdir()) == []
    # a folder of posfair's name without the marker is not posfair's: kept; a fallback folder is used, and resumed
    (tmp_path / ".out.npy.posfair-cache").mkdir()
    (tmp_path / ".out.npy.posfair-cache" / "user-file").write_text("mine")
    d = TemporaryCacheFolder(out)
    assert d.path.name.startswith(".out.npy.posfair-cache-") and (d.path / _TEMPORARY_MARK).is_file()
    import os

    os.close(d._fd)  # d was killed: its folder stays for a rerun
    e = TemporaryCacheFolder(out)
    assert e.path == d.path
    assert e.remove() and sorted(p.name for p in tmp_path.iterdir()) == [".out.npy.posfair-cache"]
    assert [p.name for p in (tmp_path / ".out.npy.posfair-cache").iterdir()] == ["user-file"]


def test_concurrent_encode_runs_on_one_output_leave_no_cache(tmp_path, tiny):
    """Three ``posfair encode`` processes at once on one output, no --cache: each exits 0, and the
    temporary cache folder they shared is gone after the last one."""
    (tmp_path / "in.txt").write_text("\n".join(f"text {i} " * 5 for i in range(60)) + "\n")
    args = ["encode", "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy"), "--chunk-size", "5",
            *map(str, tiny)]  # fmt: skip
    runs = [server().start(args, tmp_path) for _ in range(3)]  # three processes, running concurrently
    for run in runs:
        res = server().wait(run, timeout=600)
        assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy"]
