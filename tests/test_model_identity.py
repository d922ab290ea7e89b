"""A model's cache identity is its content, not where it was read from (issue 38, item 5).

The same folder under a relative path, an absolute path, a copy and a renamed copy has one fingerprint
(so one cache namespace, on one machine or on the nodes of a cluster that hold it at different paths);
a changed weight, config value or tokenizer rule -- each shown to change the vectors -- has another.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import posfair
from tiny_models import build_tiny_model

TEXTS = ["Hello World, a Short Text.", "Another SENTENCE with Capitals."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model("bert-mean", tmp_path_factory.mktemp("identity") / "models" / "A")


def _edited_copy(src, dst, name: str, edit) -> None:
    shutil.copytree(src, dst)
    path = dst / name
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")


def test_one_fingerprint_whatever_the_path(folder, tmp_path, monkeypatch):
    path, pooling = folder
    shutil.copytree(path, tmp_path / "copy")
    shutil.copytree(path, tmp_path / "elsewhere" / "renamed")
    monkeypatch.chdir(path.parent.parent)
    models = [
        posfair.load_model(p, pooling=pooling)
        for p in ("models/A", str(path), str(tmp_path / "copy"), str(tmp_path / "elsewhere" / "renamed"))
    ]
    assert len({m.fingerprint for m in models}) == 1
    # the fingerprint does not follow what the tokenizer's last call left set (truncation, padding)
    before = models[0].fingerprint
    models[0].encode(TEXTS)
    models[0]._posfair_tokenizer_digest = None  # hashed again, now that encode set truncation and padding
    assert models[0].fingerprint == before


def test_a_changed_weight_config_value_or_tokenizer_changes_it(folder, tmp_path):
    path, pooling = folder
    base = posfair.load_model(path, pooling=pooling)
    want = base.encode(TEXTS)

    config = tmp_path / "act"
    _edited_copy(path, config, "config.json", lambda t: t.replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    lower = tmp_path / "case"  # no lower-casing, in both files (transformers 5 builds the tokenizer from the config)
    _edited_copy(path, lower, "tokenizer.json", lambda t: t.replace('"lowercase": true', '"lowercase": false'))
    edit = (
        (lower / "tokenizer_config.json")
        .read_text(encoding="utf-8")
        .replace('"do_lower_case": true', '"do_lower_case": false')
    )
    (lower / "tokenizer_config.json").write_text(edit, encoding="utf-8")
    weights = tmp_path / "weights"
    shutil.copytree(path, weights)
    tensors = load_file(weights / "model.safetensors")
    name = next(k for k in sorted(tensors) if k.endswith("attention.self.query.weight"))
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, weights / "model.safetensors", metadata={"format": "pt"})

    for changed in (config, lower, weights):
        other = posfair.load_model(changed, pooling=pooling)
        assert np.abs(other.encode(TEXTS) - want).max() > 1e-4, changed  # the change changes the vectors
        assert other.fingerprint != base.fingerprint, changed
    assert json.loads((config / "config.json").read_text())["hidden_act"] == "relu"


def test_encode_reuses_the_cache_under_another_path(folder, tmp_path, monkeypatch):
    """``posfair encode -m models/A --cache C``, then the absolute path, then a renamed copy: one namespace, and
    the later runs say they took every text from the cache (and write no shard)."""
    from typer.testing import CliRunner

    from posfair.cli import app

    path, pooling = folder
    copy = tmp_path / "B"
    shutil.copytree(path, copy)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    cache = tmp_path / "C"
    monkeypatch.chdir(path.parent.parent)
    outputs = []
    for i, model in enumerate(("models/A", str(path), str(copy))):
        out = tmp_path / f"o{i}.npy"
        args = ["encode", "-i", str(tmp_path / "in.txt"), "-o", str(out), "-m", model, "--pooling", pooling]
        r = CliRunner().invoke(app, [*args, "--cache", str(cache)])
        assert r.exit_code == 0, r.output
        assert ("2 of 2 distinct texts from the cache" in r.output) == (i > 0), r.output
        outputs.append(np.load(out))
        shards = sorted(p.name for p in cache.glob("*/part-*"))
        if i == 0:
            first = shards
        assert shards == first and len(first) >= 1
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    np.testing.assert_array_equal(outputs[1], outputs[0])
    np.testing.assert_array_equal(outputs[2], outputs[0])


def test_a_store_of_other_code_is_reported_not_reused(tmp_path):
    """A namespace made by other posfair code (e.g. before the fingerprint stopped depending on the path) is not
    reused; making a new namespace of the same settings beside it says so, naming it."""
    from posfair.calibration import STOCK
    from posfair.store import EmbeddingStore, embedding_namespace

    old = embedding_namespace(EmbeddingStore(tmp_path), "0123456789abcdef0123", STOCK)
    old.get_or_compute(["k"], ["t"], lambda texts: torch.ones(len(texts), 4).numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same code: nothing to say
        embedding_namespace(EmbeddingStore(tmp_path), "fedcba98765432100000", STOCK)
    manifest = old.path / "manifest.json"
    record = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**record, "code_hash": "0000000000000000"}))
    with pytest.warns(UserWarning, match=f"made by other posfair code \\({old.path.name} .*not reuse them"):
        embedding_namespace(EmbeddingStore(tmp_path), "aaaabbbbccccddddeeee", STOCK)
