"""What a model is given: its default prompt, its tokenizer as ``encode`` applies it (:class:`PromptedTokenizer`),
and the token limit texts are encoded with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from posfair.model import compat, token_limit

__all__ = ["PromptedTokenizer", "default_prompt", "max_seq_length", "model_limit", "model_tokenizer"]


def default_prompt(model: Any) -> str:
    """The prompt ``encode`` prepends when none is given (the model's default prompt; "" for most models,
    "passage: " for the bundled multilingual-e5-small)."""
    return (compat.resolve_prompt(model, None, None) or "") if hasattr(model, "prompts") else ""


class PromptedTokenizer:
    """A tokenizer that sees texts as ``encode`` does: the model's default prompt in front of every text
    encoded whole (``add_special_tokens=True``), with character offsets reported relative to the text
    itself (tokens lying inside the prompt get the empty offset (0, 0), like special tokens).  So token
    counts include the prompt, as the token limit does, and spans over the text need no shifting.
    Texts tokenised without special tokens (segment lengths) are tokenised without the prompt too."""

    def __init__(self, tokenizer: Any, prompt: str):
        self.tokenizer, self.prompt = tokenizer, prompt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def __call__(self, text: Any, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if add_special_tokens:
            text = self.prompt + text if isinstance(text, str) else [self.prompt + t for t in text]
        enc = self.tokenizer(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        if add_special_tokens and "offset_mapping" in enc:
            enc["offset_mapping"] = _shift_offsets(enc["offset_mapping"], len(self.prompt))
        return enc


def _shift_offsets(offsets: Any, shift: int) -> Any:
    if isinstance(offsets, torch.Tensor):
        out = (offsets - shift).clamp(min=0)
        out[offsets[..., 1] <= shift] = 0
        return out
    if offsets and isinstance(offsets[0], tuple):  # one text
        return [(max(a - shift, 0), b - shift) if b > shift else (0, 0) for a, b in offsets]
    return [_shift_offsets(o, shift) for o in offsets]


def model_tokenizer(model: Any) -> Any:
    """The model's tokenizer as ``encode`` applies it: with the model's default prompt in front, if it
    has one (:class:`PromptedTokenizer`).  ValueError if the model exposes no tokenizer."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"model {type(model).__name__} exposes no tokenizer; token spans need one")
    prompt = default_prompt(model)
    return PromptedTokenizer(tok, prompt) if prompt else tok


def model_limit(model: Any, max_seq_length: int | None = None) -> int:
    """The token limit texts are encoded with: :func:`posfair.model.token_limit`, the one rule of
    every posfair command (``max_seq_length`` if given, else the model's configured one, never
    above its position limit)."""
    return token_limit(model, max_seq_length)


@contextlib.contextmanager
def max_seq_length(model: Any, length: int) -> Iterator[None]:
    """Within the block, ``model.max_seq_length`` is ``length`` (restored after, also on error)."""
    old = getattr(model, "max_seq_length", None)
    model.max_seq_length = length
    try:
        yield
    finally:
        if old is not None:
            model.max_seq_length = old
