"""posfair.model.compat on the installed stack (CI runs it on transformers 4.x and 5.x): the names that
differ between sentence-transformers 5.x and 6.x behave alike, and the version gate is right."""

from __future__ import annotations

import sentence_transformers
import torch
import transformers

from posfair.model import compat


def test_the_installed_stack_is_one_of_the_supported_pairs():
    assert compat.TRANSFORMERS_VERSION >= (4, 53) and compat.ST_VERSION >= (5, 1)
    assert compat.TRANSFORMERS_5 == transformers.__version__.startswith("5.")
    assert compat.ST_6 == sentence_transformers.__version__.startswith("6.")
    assert compat.TRANSFORMERS_5 == compat.ST_6  # the two stacks posfair is tested on


def test_pooling_mode_round_trip_pools_with_the_mode_set():
    pool = compat.Pooling(4, pooling_mode="mean")
    assert compat.pooling_mode(pool) == "mean"
    tokens = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    features = {"token_embeddings": tokens, "attention_mask": torch.tensor([[1, 1, 1], [0, 1, 1]])}
    for mode, want in (("cls", tokens[:, 0]), ("lasttoken", tokens[:, -1]), ("mean", None)):
        compat.set_pooling_mode(pool, mode)
        assert compat.pooling_mode(pool) == mode
        got = pool(dict(features))["sentence_embedding"]
        if want is None:
            want = torch.stack([tokens[0].mean(0), tokens[1, 1:].mean(0)])
        if mode == "cls":
            torch.testing.assert_close(got[0], want[0])  # the first row has no padding
        else:
            torch.testing.assert_close(got, want)
    assert compat.pooling_mode(torch.nn.Identity()) is None


def test_embedding_dimension_and_prompts(minilm):
    assert compat.embedding_dimension(minilm) == 384 == minilm.get_embedding_dimension()
    assert compat.resolve_prompt(minilm, "query: ", None) == "query: "
    feats = compat.preprocess(minilm, ["a b c"], "query: ")
    plain = minilm.tokenize(["query: a b c"])
    assert torch.equal(feats["input_ids"], plain["input_ids"])
