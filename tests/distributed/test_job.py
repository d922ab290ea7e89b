"""The local executor: shards into the shared embedding namespace, resume, manifest guard, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.coverage import CalibrationFallbackWarning
from posfair.distributed import ManifestMismatch, embed_texts, plan_shards
from posfair.encoding import encode_cached
from posfair.store import (
    MANIFEST,
    DamagedShardWarning,
    EmbeddingStore,
    embedding_namespace,
    read_shard,
    text_key,
    write_shard,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*truncated")
CAL = Calibration.parse("16,0.5,0.5")


def stored(root, model, texts, calibration=STOCK):
    ns = embedding_namespace(EmbeddingStore(root), model.fingerprint, calibration)
    return ns.get([text_key(t) for t in texts])


def shard_files(root):
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")}


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
    assert not np.allclose(
        reference, encode_cached(tiny_fair, texts, None, batch_size=8), atol=1e-3
    )  # calibrated != stock
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
    # every reader of the store runs the same check
    with pytest.raises(ManifestMismatch, match="code_hash: the store has '0000000000000000'"):
        encode_cached(tiny_fair, texts[:3], EmbeddingStore(tmp_path))
    manifest_path.write_text(json.dumps(manifest))
    # a foreign shard (intact, of another dimension) dropped into the namespace
    foreign = manifest_path.parent / "part-foreign.arrow"
    write_shard(manifest_path.parent, ["k"], np.zeros((1, 8), np.float32), name="foreign")
    with pytest.raises(
        ManifestMismatch,
        match=f"^shard {foreign} was made with other settings \\(dim: the store has 64, the shard has 8\\)",
    ):
        embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)
    assert rep.written == 2


def test_cli_single_process_and_missing_ray(tmp_path, texts, tiny_spec, monkeypatch):
    from typer.testing import CliRunner

    from posfair.cli import app
    from posfair.distributed import ray_engine

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[:12]))
    spec = tiny_spec()
    args = ["--out", str(tmp_path / "s"), "--corpus", str(corpus), "--text-field", "body", "--model", spec.model,
            "--pooling", spec.pooling, "--max-seq-length", str(spec.max_seq_length), "--shard-size", "5"]  # fmt: skip
    res = CliRunner().invoke(app, ["embed", *args])
    assert res.exit_code == 0, res.output
    assert "single process" in res.output and "12 distinct texts" in res.output and "3 shards written" in res.output
    assert len(list((tmp_path / "s").glob("*/part-*.arrow"))) == 3
    monkeypatch.setattr(ray_engine, "ray_available", lambda: False)
    res = CliRunner().invoke(app, ["embed", *args, "--workers", "2"])
    assert res.exit_code != 0 and "pip install -e '.[ray]' in a clone of the posfair repository" in res.output
    res = CliRunner().invoke(app, ["embed", *args])
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
    assert read_shard(next(iter(root.glob("*/part-*.arrow"))))[1].shape == (4, 64)  # complete shards only
    rep = embed_texts(texts, root, spec, model=tiny_fair, shard_size=4)
    assert rep.skipped == len(files) and rep.written == 15 - len(files)
    assert {k: shard_files(root)[k] for k in files} == files
    assert stored(root, tiny_fair, texts).shape == (len(texts), 64)


def test_a_damaged_shard_is_set_aside_and_recomputed_bit_identically(tmp_path, texts, tiny_spec, tiny_fair):
    spec = tiny_spec()
    embed_texts(texts, tmp_path / "clean", spec, model=tiny_fair, shard_size=16)
    embed_texts(texts, tmp_path / "s", spec, model=tiny_fair, shard_size=16)
    shards = sorted((tmp_path / "s").glob("*/part-*.arrow"))
    shards[0].write_bytes(shards[0].read_bytes()[:100])  # truncated
    shards[2].write_bytes(b"")  # zero bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rep = embed_texts(texts, tmp_path / "s", spec, model=tiny_fair, shard_size=16)
    moved = [f.with_name(f.name + ".damaged-1") for f in (shards[0], shards[2])]
    messages = [str(w.message) for w in caught if w.category is DamagedShardWarning]
    assert [m.split(" (")[0] for m in messages] == [
        f"damaged cache shard {shards[0]}",
        f"damaged cache shard {shards[2]}",
    ]
    assert [m.split("): ")[-1] for m in messages] == [f"moved to {m}; its vectors are recomputed" for m in moved]
    assert all(m.exists() for m in moved) and moved[1].read_bytes() == b""  # set aside, never deleted
    assert (rep.written, rep.skipped, rep.encoded) == (2, 2, 32)
    assert {f.name for f in (tmp_path / "s").glob("*/part-*.arrow")} == {
        f.name for f in (tmp_path / "clean").glob("*/part-*.arrow")
    }
    np.testing.assert_array_equal(
        stored(tmp_path / "s", tiny_fair, texts), stored(tmp_path / "clean", tiny_fair, texts)
    )


def test_a_missing_manifest_is_rebuilt_from_the_shards(tmp_path, texts, tiny_spec, tiny_fair):
    spec = tiny_spec(calibration=CAL.to_dict())
    embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)
    manifest_path = next(tmp_path.glob(f"*/{MANIFEST}"))
    original = json.loads(manifest_path.read_text())
    manifest_path.unlink()
    with pytest.warns(
        UserWarning,
        match=f"^store {manifest_path.parent} had no readable manifest.json: rebuilt it from the metadata of its 2 shards$",
    ):
        rep = embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)
    assert rep.encoded == 0
    rebuilt = json.loads(manifest_path.read_text())
    assert rebuilt == original  # settings from the shards, the corpus from this run
    assert rebuilt["calibration"] == CAL.to_dict() and rebuilt["dim"] == 64
    # the shards' metadata alone refuses a run of other settings
    manifest_path.unlink()
    settings = read_shard(next(manifest_path.parent.glob("part-*.arrow")))[2]["settings"]
    write_shard(manifest_path.parent, ["k"], np.ones((1, 64)), name="old", settings={**settings, "code_hash": "0" * 16})
    with pytest.raises(ManifestMismatch, match="code_hash: .*'0000000000000000'"):
        embed_texts(texts[:30], tmp_path, spec, model=tiny_fair, shard_size=16)


@pytest.mark.parametrize(
    "lines,message",
    [
        (['{"body": "ok"}', '{"body": null}'], "line 2: 'body' is null"),
        (['{"body": "ok"}', "", '{"body": 123}'], "line 3: 'body' is an int (123), not a string"),
        (['{"body": "ok"}', '{"body": "  "}', '{"body": null}'], "line 2: 'body' is empty (2 unusable texts in all)"),
        ([], "no texts to embed (the input is empty)"),
    ],
)
def test_cli_refuses_unusable_texts_by_line(tmp_path, lines, message, monkeypatch):
    from typer.testing import CliRunner

    from posfair.cli import app, checks

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    res = CliRunner().invoke(
        app, ["embed", "--out", str(tmp_path / "s"), "--corpus", str(corpus), "--text-field", "body"]
    )
    assert res.exit_code == 2 and res.stderr == f"error: {corpus}: {message}\n"
    assert not (tmp_path / "s").exists()


def test_cli_names_a_damaged_shard_in_one_warning_line(tmp_path, texts, tiny_spec):
    from typer.testing import CliRunner

    from posfair.cli import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:12]))
    spec = tiny_spec()
    args = ["--out", str(tmp_path / "s"), "--corpus", str(corpus), "--model", spec.model, "--pooling", spec.pooling,
            "--max-seq-length", str(spec.max_seq_length), "--shard-size", "5"]  # fmt: skip
    assert CliRunner().invoke(app, ["embed", *args]).exit_code == 0
    before = stored(tmp_path / "s", spec.load_model(), texts[:12])
    shard = sorted((tmp_path / "s").glob("*/part-*.arrow"))[1]
    shard.write_bytes(b"garbage" * 10)
    res = CliRunner().invoke(app, ["embed", *args])
    assert res.exit_code == 0, res.output
    assert [line for line in res.stderr.splitlines() if "damaged" in line] == [  # (model loading prints progress too)
        f"warning: damaged cache shard {shard} (not a complete Arrow IPC file: 70 bytes, cut short or overwritten): "
        f"moved to {shard}.damaged-1; its vectors are recomputed"
    ]
    assert "1 shard written, 2 already present" in res.stdout
    np.testing.assert_array_equal(stored(tmp_path / "s", spec.load_model(), texts[:12]), before)


def test_calibrated_share_is_reported_once_for_the_corpus(tmp_path, texts, tiny_spec, tiny_fair):
    """The job counts the texts its calibration changes once (not per shard) and reports the share."""
    cal = Calibration(basket_size=32, layers=1, strength=1.0)
    distinct = list(dict.fromkeys(texts))
    # by hand: CLS pooling isolates [CLS]; a text is calibrated when its content (tokens after
    # truncation minus the isolated [CLS]) is longer than one basket
    lengths = np.minimum(tiny_fair.token_lengths(distinct), tiny_fair.max_seq_length)
    expected = float(np.mean(lengths - 1 > 32))
    assert 0 < expected < 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rep = embed_texts(texts, tmp_path, tiny_spec(calibration=cal.to_dict()), model=tiny_fair, shard_size=8)
    fallback = [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
    assert len(fallback) == 1, [str(w.message) for w in fallback]
    assert f"calibrated share {expected:.3f}" in str(fallback[0].message)
    assert rep.calibrated_share == pytest.approx(expected)
    assert embed_texts(texts, tmp_path / "stock", tiny_spec(), model=tiny_fair, shard_size=8).calibrated_share is None


@pytest.mark.parametrize("part", ["documents", "queries"])
def test_cli_embeds_a_benchmark_part_of_any_layout(tmp_path, tiny_spec, tiny_fair, part):
    """``embed --part`` reads a FineWeb-PosQ file (not PosIR's layout) as the retrieval loader does:
    the stored vectors are those of the loader's texts, and nothing else is stored."""
    import pandas as pd
    from typer.testing import CliRunner

    from posfair.cli import app
    from posfair.retrieval import load_benchmark

    rows = [
        {
            "question": "where is the fox",
            "content": "the quick brown fox jumps over the lazy dog",
            "span_class": ["beginning"],
        },
        {
            "question": "what does the cat do",
            "content": "a cat sleeps on the warm mat all afternoon",
            "span_class": ["end"],
        },
        {"question": "who sleeps", "content": "the quick brown fox jumps over the lazy dog", "span_class": ["middle"]},
    ]
    path = tmp_path / "fineweb.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    bench = load_benchmark(str(path))
    want = bench.corpus_texts if part == "documents" else bench.query_texts
    spec = tiny_spec()
    res = CliRunner().invoke(app, ["embed", "--out", str(tmp_path / "s"), "--corpus", str(path), "--part", part,
                                   "--model", spec.model, "--pooling", spec.pooling, "--max-seq-length", str(spec.max_seq_length)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (
        f"{len(set(want))} distinct texts" in res.output
        and f"benchmark fineweb-posq ({part})" in open(next((tmp_path / "s").glob("*/manifest.json"))).read()
    )
    ns = embedding_namespace(EmbeddingStore(tmp_path / "s"), tiny_fair.fingerprint, STOCK)
    assert len(ns) == len(set(want))
    np.testing.assert_allclose(
        ns.get([text_key(t) for t in want]), encode_cached(tiny_fair, want, None, batch_size=8), atol=1e-5
    )
