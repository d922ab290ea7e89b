"""The local executor: shards into the shared embedding namespace, resume, manifest guard, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posfair import Calibration
from posfair.distributed import ManifestMismatch, embed_texts, plan_shards
from posfair.store import EmbeddingStore, embedding_namespace, encode_cached, text_key

pytestmark = pytest.mark.filterwarnings("ignore:.*truncated")
CAL = Calibration.parse("16,0.5,0.5")


def stored(root, model, texts, calibration=None):
    ns = embedding_namespace(EmbeddingStore(root), model.fingerprint, calibration)
    return ns.get([text_key(t) for t in texts])


def shard_files(root):
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in root.glob("*/part-*.npz")}


def test_plan_is_deterministic_and_deduplicated(texts):
    a, b = plan_shards(texts, 16), plan_shards(list(texts), 16)
    assert [s.id for s in a] == [s.id for s in b]
    assert [len(s.keys) for s in a] == [16, 16, 16, 12]  # 62 texts, 2 duplicates
    assert plan_shards(texts[:-2], 16)[0].id == a[0].id
    with pytest.raises(ValueError, match="empty"):
        plan_shards(["ok", "  "], 4)


def test_fixed_batching_is_bit_identical_to_encode_cached(tmp_path, texts, tiny_spec, tiny_fair):
    rep = embed_texts(texts, tmp_path / "job", tiny_spec(batching="fixed"), model=tiny_fair, shard_size=16)
    assert (rep.shards, rep.written, rep.encoded) == (4, 4, 60)
    ref = encode_cached(tiny_fair, texts, EmbeddingStore(tmp_path / "ref"), batch_size=8, chunk_size=16)
    np.testing.assert_array_equal(stored(tmp_path / "job", tiny_fair, texts), ref)


def test_consumers_find_everything_computed(tmp_path, texts, tiny_spec, tiny_fair, monkeypatch):
    rep = embed_texts(texts, tmp_path, tiny_spec(calibration=CAL.to_dict()), model=tiny_fair, shard_size=16)
    assert rep.tokens > 0 and rep.padded >= rep.tokens
    reference = encode_cached(tiny_fair, texts, None, calibration=CAL, batch_size=8)
    assert not np.allclose(reference, encode_cached(tiny_fair, texts, None, batch_size=8), atol=1e-3)  # calibrated != stock
    calls = []
    monkeypatch.setattr(type(tiny_fair), "encode", lambda self, *a, **k: calls.append(a) or np.zeros((0, 64)))
    got = encode_cached(tiny_fair, texts, EmbeddingStore(tmp_path), calibration=CAL)
    assert calls == []  # the audit/retrieval path recomputes nothing
    # length-aware batches differ from sentence-transformers' batches only in float summation order
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-5)


def test_resume_after_a_crash_skips_finished_shards(tmp_path, texts, tiny_spec, tiny_fair):
    spec = tiny_spec()
    done = []

    def crash_after_two(res):
        done.append(res["shard"])
        if len(done) == 2:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        embed_texts(texts, tmp_path / "a", spec, model=tiny_fair, shard_size=16, after_shard=crash_after_two)
    before = shard_files(tmp_path / "a")
    assert len(before) == 2
    seen = []
    rep = embed_texts(texts, tmp_path / "a", spec, model=tiny_fair, shard_size=16, progress=seen.append)
    assert (rep.written, rep.skipped, rep.encoded) == (2, 2, 60 - 32)
    assert sum(seen) == 60
    after = shard_files(tmp_path / "a")
    assert {k: after[k] for k in before} == before  # not rewritten
    embed_texts(texts, tmp_path / "b", spec, model=tiny_fair, shard_size=16)
    assert set(after) == set(shard_files(tmp_path / "b"))  # same shard files as an uninterrupted run
    np.testing.assert_array_equal(stored(tmp_path / "a", tiny_fair, texts), stored(tmp_path / "b", tiny_fair, texts))
    again = embed_texts(texts, tmp_path / "a", spec, model=tiny_fair, shard_size=16)
    assert (again.written, again.encoded) == (0, 0) and shard_files(tmp_path / "a") == after  # idempotent


def test_texts_already_cached_by_encode_cached_are_not_recomputed(tmp_path, texts, tiny_spec, tiny_fair):
    encode_cached(tiny_fair, texts[:20], EmbeddingStore(tmp_path), batch_size=8)
    rep = embed_texts(texts, tmp_path, tiny_spec(), model=tiny_fair, shard_size=16)
    assert rep.encoded == 60 - 20 and rep.skipped == 1  # the first shard was wholly cached


def test_refuses_to_mix_settings(tmp_path, texts, tiny_spec, tiny_fair):
    spec = tiny_spec()
    rep = embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)
    manifest_path = next(tmp_path.glob("*/manifest.json"))
    manifest = json.loads(manifest_path.read_text())
    assert manifest["fingerprint"] == tiny_fair.fingerprint and manifest["calibration"] is None
    assert manifest["corpora"][0]["texts"] == 30 and manifest["posfair_version"]
    with pytest.raises(ManifestMismatch, match="another corpus"):
        embed_texts(texts[30:], tmp_path, spec, model=tiny_fair, shard_size=16)
    # a subset of what is stored writes nothing and is accepted; --add-corpus extends the store
    assert embed_texts(texts[:10], tmp_path, spec, model=tiny_fair, shard_size=16).encoded == 0
    assert embed_texts(texts[30:], tmp_path, spec, model=tiny_fair, shard_size=16, add_corpus=True).encoded == 30
    # shards of another code version
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "code_hash": "0" * 16}))
    with pytest.raises(ManifestMismatch, match="code_hash"):
        embed_texts(texts, tmp_path, spec, model=tiny_fair, shard_size=16)
    manifest_path.write_text(json.dumps(manifest))
    # a foreign shard (other dimension) dropped into the namespace
    np.savez(manifest_path.parent / "part-foreign.npz", keys=np.array(["k"]), vectors=np.zeros((1, 8), np.float32))
    with pytest.raises(ManifestMismatch, match="part-foreign"):
        embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)
    assert rep.written == 2


def test_cli_single_process_and_missing_ray(tmp_path, texts, tiny_spec, monkeypatch):
    from typer.testing import CliRunner

    from posfair.distributed import cli, job

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[:12]))
    spec = tiny_spec()
    args = ["--out", str(tmp_path / "s"), "--corpus", str(corpus), "--text-field", "body", "--model", spec.model,
            "--pooling", spec.pooling, "--max-seq-length", str(spec.max_seq_length), "--shard-size", "5"]  # fmt: skip
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    assert "single process" in res.output and "12 distinct texts" in res.output and "3 shards written" in res.output
    assert len(list((tmp_path / "s").glob("*/part-*.npz"))) == 3
    monkeypatch.setattr(job, "ray_available", lambda: False)
    res = CliRunner().invoke(cli.app, [*args, "--workers", "2"])
    assert res.exit_code != 0 and "pip install 'posfair[ray]'" in res.output
    res = CliRunner().invoke(cli.app, args)
    assert "Ray is not installed" in res.output and "0 shards written, 3 already present" in res.output


DRIVER = """
import json, sys, warnings
warnings.simplefilter("ignore")
from posfair.distributed import EmbedSpec, embed_texts
texts = json.loads(open(sys.argv[1]).read())
embed_texts(texts, sys.argv[2], EmbedSpec.from_dict(json.loads(sys.argv[3])), shard_size=4,
            after_shard=lambda res: print("shard", flush=True))
"""


def test_killed_driver_loses_only_the_shard_in_flight(tmp_path, texts, tiny_spec, tiny_fair):
    import os
    import signal
    import subprocess
    import sys

    spec = tiny_spec()
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "texts.json"), str(root), json.dumps(spec.to_dict())],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for _ in range(3):  # three shards written, then SIGKILL (no cleanup of any kind)
            assert proc.stdout.readline() == "shard\n"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    files = shard_files(root)
    assert 3 <= len(files) < 15
    with np.load(next(iter(root.glob("*/part-*.npz"))), allow_pickle=False) as z:
        assert z["vectors"].shape == (4, 64)  # complete shards only
    rep = embed_texts(texts, root, spec, model=tiny_fair, shard_size=4)
    assert rep.skipped == len(files) and rep.written == 15 - len(files)
    assert {k: shard_files(root)[k] for k in files} == files
    assert stored(root, tiny_fair, texts).shape == (len(texts), 64)
