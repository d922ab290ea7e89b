"""What posfair reads off any sentence-transformers model: its token limits and its cache identity.

:func:`token_limit` is the one rule of every command and pipeline for how many tokens
a text is encoded with (:func:`position_limit` is what the model's position table
allows); :func:`model_fingerprint` is the identity under which embeddings are cached.
All three work for a :class:`~posfair.model.FairModel` and for a plain
``SentenceTransformer``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from posfair.model import compat

__all__ = ["config_content", "display_name", "model_fingerprint", "position_limit", "token_limit"]

# RoBERTa-style embeddings number positions from padding_idx + 1 (padding_idx = pad_token_id)
_ROBERTA_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert")


def _auto_config(model):
    first = next(iter(model._modules.values()), None) if hasattr(model, "_modules") else None
    auto = getattr(first, "auto_model", None) or getattr(first, "model", None)
    return getattr(auto, "config", None)


def display_name(model) -> str:
    """The one name of a model in every output (tables, reports, manifests): the name ``posfair.load_model``
    gave it (e.g. "all-MiniLM-L6-v2 (bundled)", the honest name of a bundled model, or the hub id / folder),
    else the model card's base model, else its path, else its class."""
    for value in (
        getattr(model, "display_name", None),
        getattr(getattr(model, "model_card_data", None), "base_model", None),
        getattr(model, "name_or_path", None),
    ):
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def position_limit(model) -> int | None:
    """The most tokens (special tokens included) the model's position embeddings allow.

    ``max_position_embeddings`` of the transformers config; RoBERTa-family models number
    positions from ``pad_token_id + 1``, so they lose ``pad_token_id + 1`` entries (XLM-R:
    514 - 2 = 512).  Without a position table the tokenizer's ``model_max_length`` is used;
    None when neither is known.  Works for any sentence-transformers model.
    """
    cfg = _auto_config(model)
    n = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
    if isinstance(n, int) and n > 0:
        if getattr(cfg, "model_type", "") in _ROBERTA_POSITIONS:
            pad = getattr(cfg, "pad_token_id", None)
            n -= (1 if pad is None else int(pad)) + 1
        return int(n)
    tml = getattr(getattr(model, "tokenizer", None), "model_max_length", None)
    if isinstance(tml, int) and 0 < tml < 1_000_000:
        return tml
    return None


def token_limit(model, max_seq_length: int | None = None) -> int:
    """The token limit posfair encodes with: the one rule every command and pipeline follows.

    ``max_seq_length`` (a user's ``--max-seq-length``) if given, else the model's own
    configured ``max_seq_length`` (what sentence-transformers truncates at: 256 for the
    bundled all-MiniLM-L6-v2), else its position limit.  A request above the position
    limit, or below 4 tokens, is refused with ``ValueError``.
    """
    limit = position_limit(model)
    if max_seq_length is not None:
        if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, (int, np.integer)):
            raise ValueError(f"max_seq_length must be a whole number; got {max_seq_length!r}")
        if max_seq_length < 4 or (limit is not None and max_seq_length > limit):
            raise ValueError(
                f"max_seq_length must be in [4, {limit if limit is not None else 'inf'}] for this model "
                f"(4 to its position limit); got {max_seq_length}"
            )
        return int(max_seq_length)
    configured = getattr(model, "max_seq_length", None)
    if isinstance(configured, int) and configured > 0:
        return configured if limit is None else min(configured, limit)
    if limit is None:
        raise ValueError(
            "cannot tell the model's token limit (no max_seq_length, no position table): pass max_seq_length"
        )
    return limit


def _weights_digest(model: torch.nn.Module) -> str:
    digest = getattr(model, "_posfair_weights_digest", None)
    if digest is None:
        h = hashlib.sha256()
        with torch.no_grad():
            for name, p in sorted(model.state_dict().items()):
                h.update(json.dumps([name, str(p.dtype), list(p.shape)]).encode())
                if p.numel():
                    h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy())
        digest = h.hexdigest()
        model._posfair_weights_digest = digest  # weights are fixed at inference time
    return digest


def config_content(config) -> dict:
    """A transformers config as content: every field, less the ones that say where or how it was loaded.

    ``to_dict`` carries ``_name_or_path`` (the folder or hub id it was read from) and, depending on the
    transformers release, other private loading state (``_commit_hash``, ``_attn_implementation_autoset``,
    ...): fields starting with "_" are dropped; every other field is kept, whether or not it changes what
    the model computes (e.g. ``hidden_act``, ``layer_norm_eps``, ``dtype``, ``transformers_version``).
    """
    return {k: v for k, v in config.to_dict().items() if not k.startswith("_")}


def _tokenizer_digest(model, tok) -> str:
    """SHA-256 of what the tokenizer does: a fast tokenizer's full definition (vocabulary, normaliser,
    pre-tokeniser, post-processor, added tokens), without its per-call truncation and padding state;
    else its vocabulary and special tokens.  Cached per tokenizer object."""
    cached = getattr(model, "_posfair_tokenizer_digest", None)
    if cached is not None and cached[0] == id(tok):
        return cached[1]
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        truncation, padding = backend.truncation, backend.padding  # set by the last call, not by the model
        try:
            backend.no_truncation()
            backend.no_padding()
            text = backend.to_str()
        finally:
            if truncation is not None:
                backend.enable_truncation(**truncation)
            if padding is not None:
                backend.enable_padding(**padding)
    else:
        get_vocab = getattr(tok, "get_vocab", None)
        spec = {
            "vocab": sorted(get_vocab().items()) if callable(get_vocab) else None,
            "special": getattr(tok, "special_tokens_map", None),
        }
        text = json.dumps(spec, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()
    model._posfair_tokenizer_digest = (id(tok), digest)
    return digest


def model_fingerprint(model) -> str:
    """The cache identity of any sentence-transformers model (a FairModel or a plain one), by content only.

    What it hashes: the weights (every tensor's name, dtype, shape and bytes), the transformers
    config's content (:func:`config_content`: not the path it was read from), what the tokenizer
    does, the pooling, the token limit, the padding side, lower-casing, the modules and the default
    prompt.  The same model under another path, copied or renamed, has the same fingerprint; a
    changed weight, config value or tokenizer has another.
    """
    h = hashlib.sha256(b"posfair model fingerprint 2\x00")  # scheme 1 hashed the config with its path
    h.update(_weights_digest(model).encode())
    first = next(iter(model._modules.values()), None)
    auto = getattr(first, "auto_model", None)
    if auto is not None:
        h.update(type(auto).__name__.encode())
        h.update(json.dumps(config_content(auto.config), sort_keys=True, default=str).encode())
    tok = getattr(model, "tokenizer", None)
    pooling = getattr(model, "pooling", None)
    if pooling is None:
        pooling = [compat.pooling_mode(m) for m in model._modules.values()]
    h.update(
        json.dumps(
            [
                str(pooling),
                model.max_seq_length,
                getattr(tok, "padding_side", None),
                type(tok).__name__,
                len(tok) if tok is not None else 0,
                [type(m).__name__ for m in model._modules.values()],
                bool(getattr(first, "do_lower_case", False)),
                _tokenizer_digest(model, tok) if tok is not None else None,
            ]
        ).encode()
    )
    # what encode prepends when no prompt is given changes every embedding stored under this fingerprint
    # (explicit prompts are part of each store namespace)
    default = compat.resolve_prompt(model, None, None) if hasattr(model, "prompts") else None
    if default:
        h.update(json.dumps({"default_prompt": default}).encode())
    return h.hexdigest()[:20]
