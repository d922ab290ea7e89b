"""posfair fit --adapter lora on a seeded tiny model: only the adapter trains, the saved folder is an adapter folder
far smaller than the model, posfair.load_model and peft read it back to the trained vectors, the adapter disabled
gives stock, bad targets are refused in one line before any fit, and the held-out report names the adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import posfair
from posfair.repair.finetune import FinetuneSettings, LoraSettings, add_lora, check_lora_targets, fit_finetune

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fit import _two_families  # noqa: E402

TEXTS = ["The first section of a report.", "A second, longer section that says something else entirely."]


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _adapters_enabled(model, on: bool) -> None:
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.enable_adapters(on)


def _base_weights(model) -> dict[str, torch.Tensor]:
    """Every weight of the model but the adapter's, by its stock name."""
    return {n.replace(".base_layer", ""): p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_only_the_adapter_trains_and_both_loaders_read_the_trained_model(tiny_model_path, tmp_path):
    from posfair.repair.data import repair_split

    path, _ = tiny_model_path("bert-mean")
    stock = posfair.load_model(str(path), max_seq_length=64)
    model = posfair.load_model(str(path), max_seq_length=64)
    lora = LoraSettings(rank=4, targets=check_lora_targets(model, ()))
    assert lora.alpha == 8.0 and lora.targets == (
        "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
    )  # fmt: skip
    add_lora(model, lora, str(path))
    split = repair_split(model, _two_families(), limit=64)
    settings = FinetuneSettings(steps=6, batch_size=4, learning_rate=lora.learning_rate, eval_every=3)
    fit_finetune(model, split.train, split.dev, str(tmp_path / "work"), settings)
    trained = model.encode(TEXTS)
    assert not np.allclose(trained, stock.encode(TEXTS), atol=1e-4)  # the adapter moved the model
    # every weight of the model is still stock's: the adapter alone trained
    base = _base_weights(model)
    assert base.keys() == dict(stock.named_parameters()).keys()
    assert all(torch.equal(base[n], p) for n, p in stock.named_parameters())
    # checkpoints hold the adapter alone, and the best on dev came back from one
    checkpoints = sorted((tmp_path / "work").glob("checkpoint-*"))
    assert checkpoints and all((c / "adapter_model.safetensors").is_file() for c in checkpoints)
    assert not any((c / "model.safetensors").exists() for c in checkpoints)

    model.save(str(tmp_path / "adapter"))
    stock.save(str(tmp_path / "full"))
    folder = tmp_path / "adapter"
    assert (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").exists()
    assert _size(folder) < _size(tmp_path / "full") / 5
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(path)
    # posfair's loader: base and adapter
    loaded = posfair.load_model(str(folder), max_seq_length=64)
    np.testing.assert_allclose(loaded.encode(TEXTS), trained, atol=1e-5)
    assert all(torch.equal(w, dict(stock.named_parameters())[n]) for n, w in _base_weights(loaded).items())
    _adapters_enabled(loaded, False)
    np.testing.assert_allclose(loaded.encode(TEXTS), stock.encode(TEXTS), atol=1e-6)
    # peft's own loader, on plain sentence-transformers: a standard PEFT adapter folder
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(str(path))
    plain.max_seq_length = 64
    PeftModel.from_pretrained(plain[0].auto_model, str(folder))
    np.testing.assert_allclose(plain.encode(TEXTS), trained, atol=1e-5)


def test_a_lora_fit_saves_the_adapter_folder_and_its_report_names_the_adapter(tiny_model_path, tmp_path):
    from posfair.repair.fitting import fit_repair

    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "out"
    res = fit_repair(str(path), out, corpus=_two_families(), method="finetune", max_seq_length=64, steps=3,
                     save_failing=True, lora=LoraSettings(rank=4, targets=("query", "value")))  # fmt: skip
    assert res.saved and res.method == "finetune+lora r=4"
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert res.folder_mib == pytest.approx(_size(out) / 2**20 - _size(out / "fit") / 2**20, rel=0.01)
    saved = json.loads((out / "fit" / "heldout.json").read_text())
    assert saved["method"] == "finetune+lora r=4" and saved["fitted"]["lora"]["targets"] == ["query", "value"]
    assert saved["fitted"]["finetune"]["learning_rate"] == LoraSettings().learning_rate
    md = (out / "fit" / "heldout.md").read_text()
    header, _, row = md.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")], strict=True))
    assert cells["method"] == "finetune+lora r=4" and float(cells["folder MiB"]) == round(res.folder_mib, 1)
    assert float(cells["peak MiB"]) == round(res.peak_rss_mib)
    # the judged model is the reloaded adapter folder, as a user loads it
    loaded = posfair.load_model(str(out))
    assert sum("lora_" in n for n, _ in loaded.named_parameters()) == 2 * 2 * 4  # A and B, 2 targets, 4 layers


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--adapter", "lora", "--lora-targets", "query,nosuch"],
         "error: --lora-targets query,nosuch: 'nosuch' names no linear module of the model (its attention "
         "projections: attention.self.query, attention.self.key, attention.self.value, attention.output.dense)"),
        (["--lora-rank", "8"], "error: --lora-rank: only with --adapter lora"),
        (["--adapter", "lora", "--method", "tempscale"], "error: --adapter lora: only with --method finetune"),
    ],
)  # fmt: skip
def test_bad_adapter_options_are_refused_in_one_line_before_any_fit(args, line, tiny_model_path, tmp_path):
    path, _ = tiny_model_path("bert-mean")
    res = subprocess.run([sys.executable, "-m", "posfair.cli", "fit", "--model", str(path), "--out",
                          str(tmp_path / "o"), *args], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), res.stderr
    assert not (tmp_path / "o").exists()  # refused before any work: nothing written
