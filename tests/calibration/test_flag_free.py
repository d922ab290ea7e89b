"""Calibrated folders load calibrated without posfair's module class and without trust_remote_code.

``FairModel.save`` with a default calibration writes stock sentence-transformers modules; the
folder's ``config.json`` names posfair's registered attention function and carries the
calibration.  After ``import posfair``, plain ``SentenceTransformer(path)`` and
``AutoModel.from_pretrained(path)`` must give exactly what ``FairModel.encode(calibration=...)``
gives -- on both stacks (this file is in the transformers 4.x CI run too) -- and without
posfair imported, loading must fail naming posfair.  Folders of the previous format (posfair's
module class in ``modules.json``) keep loading.
"""

from __future__ import annotations

import json
import os
import pickle  # only to mimic how multi-process workers receive the model
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.model import compat
from tiny_models import ARCHS

LONG = "Calibration gives later baskets as much attention as early ones. " * 8
TEXTS = [LONG, "A much shorter text about search engines and their indexes.", LONG[:200]]
CAL = Calibration(basket_size=16, layers=0.5, strength=1.0)


def _calibrated_folder(model, path) -> tuple[np.ndarray, np.ndarray]:
    """Save ``model`` with CAL as its default; returns (calibrated, stock) embeddings of TEXTS."""
    want = model.encode(TEXTS, calibration=CAL)
    stock = model.encode(TEXTS, calibration=STOCK)
    assert np.abs(want - stock).max() > 1e-3, "CAL must change these texts for the test to mean anything"
    model.set_calibration(CAL).save(str(path))
    return want, stock


def test_minilm_folder_is_flag_free(tmp_path):
    model = posfair.load_model()
    want, _ = _calibrated_folder(model, tmp_path / "m")
    types = [e["type"] for e in json.loads((tmp_path / "m" / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types), types
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["attn_implementation"] == "posfair_sdpa"
    assert Calibration.from_dict(config["posfair_calibration"]) == CAL and config["posfair_pooling"] == "mean"
    readme = (tmp_path / "m" / "README.md").read_text()
    assert "## Calibrated with posfair" in readme and "import posfair" in readme
    assert readme.startswith("---\n")  # the note goes after sentence-transformers' front matter
    # in this process posfair is imported: no flag needed, calibrated embeddings
    plain = SentenceTransformer(str(tmp_path / "m"))
    np.testing.assert_allclose(plain.encode(TEXTS), want, atol=1e-5)
    # as multi-process workers receive it (on transformers 4.x its attention classes are posfair's)
    clone = pickle.loads(pickle.dumps(plain))
    np.testing.assert_allclose(clone.encode(TEXTS), want, atol=1e-5)


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=600
    )


def test_fresh_process_loads_calibrated_after_import_posfair(tmp_path):
    """What a user runs: ``import posfair`` first (cheap), then the libraries they already use."""
    model = posfair.load_model()
    want, stock = _calibrated_folder(model, tmp_path / "m")
    np.save(tmp_path / "want.npy", want)
    np.save(tmp_path / "stock.npy", stock)
    texts = json.dumps(TEXTS)
    ok = _run(
        f"""
        import json, sys
        import numpy as np
        import posfair
        assert "torch" not in sys.modules, "import posfair must stay light"
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers import AutoModel, AutoTokenizer
        texts = json.loads({texts!r})
        want = np.load({str(tmp_path / "want.npy")!r})
        st = SentenceTransformer({str(tmp_path / "m")!r}).encode(texts)
        hf = AutoModel.from_pretrained({str(tmp_path / "m")!r})
        tok = AutoTokenizer.from_pretrained({str(tmp_path / "m")!r})
        f = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = hf(**f).last_hidden_state
        m = f["attention_mask"].unsqueeze(-1).float()
        pooled = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
        print(json.dumps({{"st": float(np.abs(st - want).max()), "hf": float(np.abs(pooled - want).max())}}))
        """
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    diffs = json.loads(ok.stdout.strip().splitlines()[-1])
    assert diffs["st"] < 1e-5 and diffs["hf"] < 1e-5, diffs
    # without posfair: a loud error that names posfair's attention function, never stock numbers
    bad = _run(f"from sentence_transformers import SentenceTransformer; SentenceTransformer({str(tmp_path / 'm')!r})")
    assert bad.returncode != 0
    assert "posfair_sdpa" in bad.stderr and "not supported" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_loads_calibrated(arch, tiny_model_path, tmp_path):
    """CLS (BERT, XLM-R, ModernBERT with sliding-window layers), mean, and last-token with left padding
    and grouped-query attention (Qwen3): plain loading equals FairModel, padded batch included."""
    path, pooling = tiny_model_path(arch)
    model = posfair.load_model(path, pooling=pooling)
    want, stock = _calibrated_folder(model, tmp_path / "m")
    plain = SentenceTransformer(str(tmp_path / "m"))
    if pooling == "lasttoken":
        assert plain.tokenizer.padding_side == "left"
    np.testing.assert_allclose(plain.encode(TEXTS), want, atol=1e-5)
    again = posfair.load_model(tmp_path / "m")
    assert again.calibration == CAL and again.pooling == pooling
    np.testing.assert_allclose(again.encode(TEXTS), want, atol=1e-5)
    # the config's calibration belongs to the FairModel now: calibration=STOCK is stock
    np.testing.assert_allclose(again.encode(TEXTS, calibration=STOCK), stock, atol=1e-5)
    # and a stock re-save drops it
    again.set_calibration(STOCK).save(str(tmp_path / "stock"))
    assert "posfair" not in (tmp_path / "stock" / "config.json").read_text()
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "stock")).encode(TEXTS), stock, atol=1e-5)


def test_automodel_token_states_match(tiny_model_path, tmp_path):
    """transformers alone: the CLS state of AutoModel on a calibrated folder is FairModel's calibrated CLS state."""
    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling)
    model.set_calibration(CAL).save(str(tmp_path / "m"))
    want = model.encode(TEXTS, output_value="token_embeddings")
    stock = model.encode(TEXTS, output_value="token_embeddings", calibration=STOCK)
    hf = AutoModel.from_pretrained(str(tmp_path / "m")).eval()
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    feats = tok(TEXTS, padding=True, truncation=True, max_length=model.max_seq_length, return_tensors="pt")
    with torch.no_grad():
        states = hf(**feats).last_hidden_state
    for i, w in enumerate(want):
        n = int(feats["attention_mask"][i].sum())
        np.testing.assert_allclose(states[i, :n].numpy(), w.numpy(), atol=1e-5)
    # calibrated where it must be: the long text's states are not the stock ones (both sides stock would pass above)
    assert (want[0] - stock[0]).abs().max() > 1e-3
    with torch.no_grad():  # and transformers without the folder's calibration gives the stock states
        plain = AutoModel.from_pretrained(path, attn_implementation="eager").eval()(**feats).last_hidden_state
    n = int(feats["attention_mask"][0].sum())
    np.testing.assert_allclose(plain[0, :n].numpy(), stock[0].numpy(), atol=1e-5)


def test_previous_format_still_loads(tmp_path):
    """Folders saved before: modules.json names posfair.model.CalibratedTransformer and
    sentence_bert_config.json carries the calibration."""
    model = posfair.load_model()
    want = model.encode(TEXTS, calibration=CAL)
    model.set_calibration(CAL)
    SentenceTransformer.save(model, str(tmp_path / "old"))  # what FairModel.save wrote before
    assert "posfair.model.CalibratedTransformer" in (tmp_path / "old" / "modules.json").read_text()
    assert "posfair_calibration" in (tmp_path / "old" / "sentence_bert_config.json").read_text()
    again = posfair.load_model(tmp_path / "old")
    assert again.calibration == CAL
    np.testing.assert_allclose(again.encode(TEXTS), want, atol=1e-5)
    if compat.ST_6:  # sentence-transformers 6 runs a third-party module class only with the flag
        with pytest.raises(ValueError, match="trust_remote_code"):
            SentenceTransformer(str(tmp_path / "old"))
    plain = SentenceTransformer(str(tmp_path / "old"), trust_remote_code=True)
    np.testing.assert_allclose(plain.encode(TEXTS), want, atol=1e-5)


def test_config_spans_follow_the_attention_mask():
    """The spans a flag-free forward reads off each layer's mask equal those of the 2-D padding mask."""
    from posfair.calibration.state import spans_from_attention_mask, spans_from_mask

    pad = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    start, end = spans_from_mask(pad, 3, 6, "cpu")
    key_pad = pad.bool()[:, None, None, :]  # bidirectional: (B, 1, 1, K)
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))[None, None] & key_pad  # (B, 1, Q, K)
    window = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs().le(1)[None, None] & key_pad  # sliding window 3
    additive = torch.where(key_pad, 0.0, torch.finfo(torch.float32).min)
    for mask in (key_pad, causal, window, additive, key_pad.expand(3, 1, 6, 6)):
        s, e = spans_from_attention_mask(mask, 3, 6, "cpu")
        assert s.tolist() == start.tolist() and e.tolist() == end.tolist()
    s, e = spans_from_attention_mask(None, 3, 6, "cpu")
    assert s.tolist() == [0, 0, 0] and e.tolist() == [5, 5, 5]
