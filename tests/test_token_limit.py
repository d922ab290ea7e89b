"""One token limit: one rule (posfair.model.token_limit) for every command, and a tuned model saved as tuned."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import typer.main
from transformers import BertConfig, XLMRobertaConfig

import posfair
from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.cli.options import MAX_SEQ_LENGTH_HELP
from posfair.fairness.experiment import AuditSettings, make_model_info
from posfair.model import position_limit, token_limit
from posfair.tuning import TEST, FairnessObjective, SearchSpace, default_fairness_settings, tune
from posfair.tuning.outputs import summary_markdown

sys.path.insert(0, str(Path(__file__).resolve().parent / "fairness"))
from conftest import tiny_corpus  # noqa: E402


class _Auto:
    def __init__(self, config):
        self.config = config


class _Module(__import__("torch").nn.Module):
    def __init__(self, config):
        super().__init__()
        self.auto_model = _Auto(config)


class _FakeST(__import__("torch").nn.Module):
    """Just enough of a SentenceTransformer for the limit rule: a first module with an auto_model config."""

    def __init__(self, config, max_seq_length=None):
        super().__init__()
        self.add_module("0", _Module(config))
        self.max_seq_length = max_seq_length
        self.tokenizer = None


@pytest.mark.parametrize(
    "config, expected",
    [
        (BertConfig(max_position_embeddings=512), 512),
        # RoBERTa positions start after padding_idx: XLM-R (pad 1) loses 2 of 514 entries
        (XLMRobertaConfig(max_position_embeddings=514, pad_token_id=1), 512),
        # with pad id 0 only one entry is lost (the audit used to assume pad 1 here and said 512)
        (XLMRobertaConfig(max_position_embeddings=514, pad_token_id=0), 513),
    ],
)
def test_position_limit_by_hand(config, expected):
    model = _FakeST(config)
    assert position_limit(model) == expected
    # the audit's limit is the same rule (one computation, not two)
    assert enc.model_limit(model, expected) == expected


def test_position_limit_of_a_real_tiny_xlmr_matches_its_embeddings(tiny_model):
    """The XLM-R limit is exactly the longest input its position table accepts."""
    model = tiny_model("xlmr")
    limit = model.position_limit
    auto = model.transformer_module.auto_model
    ids = torch.full((1, limit), 5)
    with torch.no_grad():
        auto(input_ids=ids, attention_mask=torch.ones_like(ids))  # fits
        with pytest.raises((IndexError, RuntimeError)):
            longer = torch.full((1, limit + 1), 5)
            auto(input_ids=longer, attention_mask=torch.ones_like(longer))


def test_token_limit_rule(minilm):
    # the bundled model is configured at 256 tokens with a 512-entry position table
    assert minilm.max_seq_length == 256 and minilm.position_limit == 512
    assert token_limit(minilm) == 256
    assert token_limit(minilm, 512) == 512
    for bad in (513, 3, 0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_seq_length"):
            token_limit(minilm, bad)
    # the audit follows the same rule (it used to raise the limit to 512 on its own)
    info = make_model_info(minilm, AuditSettings(configs=("en",)))
    assert info.limit == 256
    assert make_model_info(minilm, AuditSettings(configs=("en",), max_seq_length=384)).limit == 384
    assert minilm.max_seq_length == 256  # restored


def test_load_model_validates_the_limit(tiny_model_path):
    path, pooling = tiny_model_path("bert")
    assert posfair.load_model(path, pooling=pooling, max_seq_length=300).max_seq_length == 300
    with pytest.raises(ValueError, match=r"max_seq_length must be in \[4, 512\].*position limit.*513"):
        posfair.load_model(path, pooling=pooling, max_seq_length=513)


def test_every_command_states_the_same_limit_option():
    from posfair.cli import app

    group = typer.main.get_command(app)
    found = {}
    for name, cmd in group.commands.items():
        for p in cmd.params:
            if p.name == "max_seq_length":
                found[name] = (p.opts, p.help, p.default)
    expected = {"encode", "embed", "audit", "attention", "retrieval", "sweep", "tune", "build-benchmark"}
    assert expected <= set(found), sorted(expected - set(found))
    for name, (opts, help_text, default) in found.items():
        assert opts == ["--max-seq-length"], name
        if name == "fit":  # the documents a repair is fitted and judged on: 512 (tests/cli/test_vocabulary.py lists it)
            assert default == 512 and "saved folder keeps the model's own" in help_text
            continue
        assert help_text == MAX_SEQ_LENGTH_HELP, name
        assert default is None, name


def test_build_benchmark_budgets_for_the_models_limit(tmp_path):
    """A 256-token model gets documents that fit 256 tokens (it used to budget 510)."""
    from typer.testing import CliRunner

    from posfair.cli import app

    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["build-benchmark", "--out", str(out), "--k", "3"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "benchmark.json").read_text())
    model = posfair.load_model()
    assert meta["max_seq_length"] == 256
    assert meta["max_doc_tokens"] == 256 - model.special_token_count() == 254

    docs = pd.read_parquet(out / "eng-Latn" / "all" / "corpus.parquet")
    lengths = model.token_lengths(docs["text"].tolist())
    assert lengths.max() <= 256, int(lengths.max())


def test_tuned_model_saved_at_the_tuning_limit_reproduces_its_test_split(tiny_model_path, tmp_path):
    """Tuned at a longer limit than the model's configured one: the saved folder encodes at the tuning limit."""
    path, pooling = tiny_model_path("bert-mean")
    model = posfair.load_model(path, pooling=pooling, max_seq_length=24)
    settings = default_fairness_settings(
        target_docs=24,
        min_segment_tokens=1,
        max_segment_tokens=60,
        batch_size=8,
        chunk_size=8,
        max_seq_length=160,
        seed=1,
    )
    # 24 topics: dev and test draw from disjoint halves of them; seed 1 draws sets on which the tiny random model's
    # calibration flattens the dev profile, so a calibration (not stock) is chosen and saved
    obj = FairnessObjective(model, tiny_corpus(topics=24), settings, store=tmp_path / "cache")
    assert obj.info.limit == 160
    space = SearchSpace(basket_sizes=(4,), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0)
    res = tune(model, objective=obj, space=space, max_drop=1.0, save_model=tmp_path / "saved")
    assert res.chosen is not STOCK
    # its spread reduction on the test split, with the paired interval over the test split's segment sets
    eff = res.test_effect
    s_spread, c_spread = res.trial(STOCK, TEST).metrics["spread"], res.trial(res.chosen, TEST).metrics["spread"]
    assert eff.effect == pytest.approx(1 - c_spread / s_spread) and eff.effect_name == "removed"
    assert eff.units == len(obj.split_sets(TEST)) and eff.unit == "segment sets" and eff.low <= eff.high
    assert eff.verdict in summary_markdown(res)
    assert res.headline()["test_score_effect"] == pytest.approx(eff.effect)
    reloaded = posfair.load_model(tmp_path / "saved")
    assert reloaded.max_seq_length == 160 and reloaded.calibration == res.chosen
    docs = [d for inst in obj.instances[TEST] for d in inst.documents]
    assert max(d.n_tokens for d in docs) > 24  # truncation at the configured limit would change them
    # the tuner's own test-split similarities (from its cache) are reproduced by the reloaded folder
    obs = obj.observations([res.chosen], TEST)
    obs = obs[(obs.calibration == res.chosen.label()) & (obs.setting == "main")]
    texts = {d.doc_id: d.text for d in docs}
    segs = {sid: t for d in docs for sid, t in zip(d.segment_ids, d.texts, strict=True)}
    doc_vec = dict(zip(texts, reloaded.encode(list(texts.values())), strict=True))
    seg_vec = dict(zip(segs, reloaded.encode(list(segs.values())), strict=True))
    mine = [float(np.dot(doc_vec[r.doc_id], seg_vec[r.segment_id]) / np.linalg.norm(doc_vec[r.doc_id]) / np.linalg.norm(seg_vec[r.segment_id]))
            for r in obs.itertuples()]  # fmt: skip
    np.testing.assert_allclose(mine, obs["sigma"].to_numpy(), atol=1e-5)
    assert model.max_seq_length == 24  # the session model is left as it was


def test_transformers_length_warning_is_not_passed_on(tiny_model_path, caplog):
    """posfair counts tokens untruncated and reports truncation itself: transformers' own one-off warning is noise."""
    import logging

    import posfair

    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling, device="cpu", max_seq_length=32)
    long = "word " * (model.tokenizer.model_max_length + 50)
    with caplog.at_level(logging.WARNING):
        assert model.token_lengths([long])[0] > model.tokenizer.model_max_length
    assert "Token indices sequence length" not in caplog.text
