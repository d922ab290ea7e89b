"""The audit reads the shared embedding store through the same checks as every command:
a damaged shard is named in one warning line, set aside and recomputed (same results);
a store of other settings is refused with one error line."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from posfair.cli import app


def test_audit_sets_a_damaged_shard_aside_and_refuses_other_settings(tmp_path, tiny_model_path, make_corpus):
    path, _ = tiny_model_path("bert-mean")
    corpus = tmp_path / "corpus.parquet"
    make_corpus(topics=8).to_parquet(corpus)
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["audit", "--model", str(path), "--corpus", str(corpus), "--n", "2", "--langs", "en", "--docs", "12", "--min-segment-tokens", "1",
            "--max-segment-tokens", "60", "--calibration", "8,0.5,1.0", "--out", str(out), "--cache", str(cache)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    clean = pd.read_parquet(out / "observations.parquet")
    shards = sorted(cache.glob("*/part-*.arrow"))
    victim = shards[len(shards) // 2]
    victim.write_bytes(b"")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert [line for line in res.stderr.splitlines() if "damaged" in line] == [
        f"warning: damaged cache shard {victim} (empty file: 0 bytes): moved to {victim}.damaged-1; its vectors are recomputed"
    ]
    assert victim.with_name(victim.name + ".damaged-1").exists()
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "observations.parquet"), clean, check_exact=False, atol=1e-6, rtol=0
    )
    # a manifest of another code version: refused by name, before anything is computed
    manifest_file = victim.parent / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "code_hash": "0" * 16}))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert res.stderr.splitlines()[-1] == (
        f"error: store {victim.parent} was made with other settings (code_hash: the store has '0000000000000000', this run has "
        f"'{manifest['code_hash']}'): refusing to mix them; use another store folder, or delete {victim.parent} to recompute it"
    )
