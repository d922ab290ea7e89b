"""Seeded tiny randomly-initialised models of the architectures posfair must handle.

Each builder writes a transformers folder (weights + config + the bundled
MiniLM's WordPiece tokenizer, which every tiny model shares) and returns its
path; tests load it with ``posfair.load_model(path, pooling=...)``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    LlamaConfig,
    MistralConfig,
    ModernBertConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    RobertaConfig,
    XLMRobertaConfig,
)

from posfair.calibration.backends import FALLBACK, REGISTRY, backend_for
from posfair.model import bundled_model_path
from posfair.model.compat import TRANSFORMERS_5

VOCAB = 30522  # the bundled WordPiece vocabulary
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128)
# decoders with grouped-query attention
DECODER = dict(**COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, pad_token_id=0)


def _configs():
    return {
        # CLS-pooled encoders (as bge-m3 / gte)
        "bert": (BertConfig(**COMMON, max_position_embeddings=512, pad_token_id=0), "cls"),
        "xlmr": (XLMRobertaConfig(**COMMON, max_position_embeddings=514, pad_token_id=0), "cls"),
        # mean-pooled BERT (as all-MiniLM / jina-v3)
        "bert-mean": (BertConfig(**COMMON, max_position_embeddings=512, pad_token_id=0), "mean"),
        # ModernBERT alternates global and sliding-window layers; a small window makes it matter
        "modernbert": (
            ModernBertConfig(
                **COMMON,
                max_position_embeddings=512,
                local_attention=16,
                global_attn_every_n_layers=2,
                pad_token_id=0,
                bos_token_id=101,
                cls_token_id=101,
                eos_token_id=102,
                sep_token_id=102,
            ),
            "cls",
        ),
        # decoder with grouped-query attention, last-token pooling, left padding (as Qwen3-Embedding)
        "qwen3": (
            Qwen3Config(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=512,
                pad_token_id=0,
            ),
            "lasttoken",
        ),
        # the other rows of the table of backends (posfair.calibration.backends), for its route test
        "roberta": (RobertaConfig(**COMMON, max_position_embeddings=514, pad_token_id=1), "cls"),
        "qwen2": (Qwen2Config(**{k: v for k, v in DECODER.items() if k != "head_dim"}), "lasttoken"),
        "llama": (LlamaConfig(**DECODER), "lasttoken"),
        "mistral": (MistralConfig(**DECODER), "lasttoken"),
        "gemma": (GemmaConfig(**DECODER), "lasttoken"),
        "gemma2": (Gemma2Config(**DECODER, sliding_window=16), "lasttoken"),
        "gemma3_text": (Gemma3TextConfig(**DECODER, sliding_window=16), "lasttoken"),
        "phi3": (Phi3Config(**{k: v for k, v in DECODER.items() if k != "head_dim"}), "lasttoken"),
    }


#: the architectures the engine's tests run on
ARCHS = ("bert", "xlmr", "bert-mean", "modernbert", "qwen3")
#: every tiny model: ARCHS and one of each other row of the table of backends (tests/test_backends.py)
ALL_ARCHS = tuple(_configs())


def model_type(arch: str) -> str:
    """The ``config.model_type`` of the tiny ``arch``."""
    return _configs()[arch][0].model_type


def expected_mechanism(arch: str) -> str:
    """How posfair reaches ``arch``'s attention on the installed stack, "registry" or "fallback": its row of
    the table of backends (posfair.calibration.backends) says."""
    route = backend_for(model_type(arch)).route(TRANSFORMERS_5)
    assert route in (REGISTRY, FALLBACK), f"{arch}: the table of backends has no fixed route ({route})"
    return route


def build_tiny_model(arch: str, folder: Path, seed: int = 0, **overrides: object) -> tuple[Path, str]:
    """Write the tiny ``arch`` model to ``folder``; returns (path, pooling).  ``overrides``: config
    attributes to change (e.g. ``attention_probs_dropout_prob=0.5``)."""
    config, pooling = _configs()[arch]
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise AttributeError(f"{type(config).__name__} has no {key!r}")
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config)
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    # ModernBERT takes no token_type_ids (its own tokenizer emits none)
    extra = {"model_input_names": ["input_ids", "attention_mask"]} if arch == "modernbert" else {}
    AutoTokenizer.from_pretrained(bundled_model_path(), **extra).save_pretrained(folder)
    return folder, pooling


def skip_without_registry(model, arch: str, elsewhere: str) -> None:
    """Skip, by name, a test of the registry's explicit path when ``model`` does not reach transformers'
    attention registry (transformers 4.x); ``elsewhere``: which test covers that stack instead."""
    import pytest

    if model.mechanism != "registry":
        pytest.skip(
            f"on transformers 4.x {arch} does not reach the attention registry, so the registry's explicit path "
            f"does not exist there ({elsewhere})"
        )


@contextlib.contextmanager
def eager_attention(model):
    """Within: the registry's explicit path (the eager base class); SDPA again after."""
    model.transformer_module.set_attention_base("eager")
    try:
        yield
    finally:
        model.transformer_module.set_attention_base("sdpa")
