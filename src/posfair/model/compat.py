"""Where the two supported stacks differ: transformers 4.x + sentence-transformers 5.x, and
transformers 5.x + sentence-transformers 6.x.

posfair runs one code path on both stacks; everything that has a different name, import
path or signature on the two lives here, so the rest of the package imports it from one
place.  This module imports nothing from posfair (it is a leaf).

Supported ranges: transformers >= 4.53, < 6 and sentence-transformers >= 5.1, < 7.

What differs:

- sentence-transformers' module classes: the input module ``Transformer`` and ``Pooling``
  (``sentence_transformers.models`` in 5.x; ``sentence_transformers.base.modules`` /
  ``sentence_transformers.sentence_transformer.modules`` in 6.x) and the evaluator base
  ``BaseEvaluator`` (``SentenceEvaluator`` in 5.x).
- Loading a saved posfair folder: sentence-transformers 6.x resolves module types through
  ``_load_with_module_classes``; 5.x imports the ``modules.json`` type by name.
- Preparing inputs: 6.x has ``preprocess`` (prompt + tokenisation) and
  ``get_embedding_dimension``; 5.x prepends the prompt itself and calls ``tokenize``, and
  names the dimension ``get_sentence_embedding_dimension``.  5.x's ``tokenize`` strips each
  text first, 6.x's does not: posfair tokenises texts as given on both (:func:`tokenize_as_given`).
- transformers' attention registry (``AttentionInterface`` / ``AttentionMaskInterface``)
  exists on both, with the same signatures (:mod:`posfair.calibration.registry` uses it
  directly); which *architectures* dispatch through it
  differs: on 4.x BERT, XLM-RoBERTa and ModernBERT choose their attention classes
  themselves (BERT's ``BertSdpaSelfAttention`` calls SDPA, its eager class computes the
  softmax inline), so posfair reaches them through the scoped fallback
  (:mod:`posfair.calibration.fallback`); Qwen3 uses the registry on both.  Which route each
  architecture takes on each stack is the table of :mod:`posfair.calibration.backends`.
"""

from __future__ import annotations

from typing import Any

import sentence_transformers
import transformers

__all__ = [
    "TRANSFORMERS_VERSION",
    "ST_VERSION",
    "TRANSFORMERS_5",
    "ST_6",
    "Transformer",
    "Pooling",
    "BaseEvaluator",
    "POOLING_NAMES",
    "pooling_mode",
    "pooling_name",
    "set_pooling_mode",
    "load_with_module_classes",
    "preprocess",
    "tokenize_as_given",
    "resolve_prompt",
    "embedding_dimension",
    "reaches_registry",
    "set_attn_implementation",
]


def _major_minor(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


TRANSFORMERS_VERSION = _major_minor(transformers.__version__)
ST_VERSION = _major_minor(sentence_transformers.__version__)
TRANSFORMERS_5 = TRANSFORMERS_VERSION[0] >= 5
ST_6 = ST_VERSION[0] >= 6

if TRANSFORMERS_VERSION < (4, 53) or ST_VERSION < (5, 1):
    raise ImportError(
        f"posfair needs transformers >= 4.53 and sentence-transformers >= 5.1; found transformers "
        f"{transformers.__version__} and sentence-transformers {sentence_transformers.__version__}"
    )

if ST_6:
    # 6.x: the evaluator base moved to sentence_transformers.base (the old names are deprecated aliases)
    from sentence_transformers.base.evaluation.evaluator import BaseEvaluator
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
else:
    from sentence_transformers.evaluation import SentenceEvaluator as BaseEvaluator  # the 5.x name of the same base
    from sentence_transformers.models import Pooling, Transformer


def pooling_mode(module) -> str | None:
    """The pooling mode string of a ``Pooling`` module ("cls", "mean", "lasttoken", ...); None for other modules.

    sentence-transformers 6.x stores it as ``pooling_mode``; 5.x keeps one flag per mode.
    """
    mode = getattr(module, "pooling_mode", None)
    if isinstance(mode, str):
        return mode
    get = getattr(module, "get_pooling_mode_str", None)
    return get() if callable(get) else None


#: sentence-transformers' pooling-mode spellings -> posfair's pooling names (the one map of them)
POOLING_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "lasttoken", "last_token": "lasttoken"}


def pooling_name(module) -> str | None:
    """The pooling of a ``Pooling`` module in posfair's names ("cls", "mean", "lasttoken"; other
    modes, e.g. "max", as sentence-transformers spells them); None for other modules."""
    mode = pooling_mode(module)
    return POOLING_NAMES.get(mode, mode) if mode is not None else None


_ST5_POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def set_pooling_mode(module, mode: str) -> None:
    """Make the ``Pooling`` module ``module`` pool with the single mode ``mode``."""
    if ST_6:
        module.pooling_mode = mode
        return
    if mode not in _ST5_POOLING_FLAGS:
        raise ValueError(f"unknown pooling mode {mode!r}; one of {sorted(_ST5_POOLING_FLAGS)}")
    for name, flag in _ST5_POOLING_FLAGS.items():
        setattr(module, flag, name == mode)
    module.pooling_output_dimension = module.word_embedding_dimension


def load_with_module_classes(model_cls: type, path: str, module_classes: dict[str, type], **kwargs: Any):
    """Load the saved folder ``path`` as ``model_cls`` with ``modules.json`` types resolved to ``module_classes``.

    sentence-transformers 6.x takes the classes directly; 5.x imports each type by its
    dotted name (the classes given here are importable under exactly those names).
    """
    if hasattr(model_cls, "_load_with_module_classes"):
        return model_cls._load_with_module_classes(path, module_classes, **kwargs)
    return model_cls(path, **kwargs)


def resolve_prompt(model, prompt: str | None, prompt_name: str | None) -> str | None:
    """The prompt ``encode(prompt=..., prompt_name=...)`` prepends (the model's default prompt if neither)."""
    if hasattr(model, "_resolve_prompt"):
        return model._resolve_prompt(prompt, prompt_name)
    if prompt is not None:
        return prompt
    if prompt_name is not None:
        if prompt_name not in model.prompts:
            raise ValueError(f"Prompt name {prompt_name!r} not found in the configured prompts {list(model.prompts)!r}")
        return model.prompts[prompt_name]
    if model.default_prompt_name is not None:
        return model.prompts.get(model.default_prompt_name)
    return None


def preprocess(model, texts: list[str], prompt: str | None, **kwargs: Any) -> dict[str, Any]:
    """The features ``encode`` feeds the model for ``texts`` with ``prompt`` prepended (resolved already)."""
    if hasattr(model, "preprocess"):
        return model.preprocess(texts, prompt=prompt, **kwargs)
    if prompt:
        texts = [prompt + t for t in texts]
    return model.tokenize(texts, **kwargs)


def tokenize_as_given(module, texts: list, padding: str | bool = True) -> dict[str, Any]:
    """sentence-transformers 5.x's ``Transformer.tokenize`` of ``module`` without its strip: the texts (single,
    ``{key: text}`` or pairs) tokenised as given, lower-cased if the module says so, truncated to its
    ``max_seq_length``.  posfair tokenises texts as given on both stacks (6.x strips nothing; 5.x strips each
    text first, so a text ending in a space lost the trailing "▁" token a SentencePiece vocabulary gives it)."""
    output: dict[str, Any] = {}
    if isinstance(texts[0], str):
        columns = [list(texts)]
    elif isinstance(texts[0], dict):
        output["text_keys"] = [next(iter(lookup)) for lookup in texts]
        columns = [[next(iter(lookup.values())) for lookup in texts]]
    else:
        columns = [[pair[0] for pair in texts], [pair[1] for pair in texts]]
    columns = [[str(s) for s in col] for col in columns]
    if module.do_lower_case:
        columns = [[s.lower() for s in col] for col in columns]
    output.update(
        module.tokenizer(
            *columns, padding=padding, truncation="longest_first", return_tensors="pt", max_length=module.max_seq_length
        )
    )
    return output


def embedding_dimension(model) -> int | None:
    """The dimension of ``model.encode``'s output (None if unknown)."""
    if ST_6:
        return model.get_embedding_dimension()
    return model.get_sentence_embedding_dimension()


def reaches_registry(model) -> bool:
    """Whether ``model`` dispatches its attention through transformers' registry.

    transformers 5.x: every model that can switch implementations dynamically.  4.x: only
    architectures flagged ``_supports_attention_backend`` (Qwen3, Llama, ...); BERT,
    XLM-RoBERTa and ModernBERT pick their attention classes themselves there.
    """
    if not hasattr(model, "set_attn_implementation"):
        return False
    return TRANSFORMERS_5 or bool(getattr(model, "_supports_attention_backend", False))


def set_attn_implementation(model, name: str) -> None:
    """Switch ``model`` to the registered attention implementation ``name``.

    Raises ``TypeError`` when the model cannot dispatch through the registry on this
    transformers (:func:`reaches_registry`), e.g. BERT on 4.x; transformers' own errors
    (``ValueError``, ...) pass through.
    """
    if not reaches_registry(model):
        raise TypeError(
            f"{type(model).__name__} does not dispatch its attention through transformers' registry "
            f"on transformers {transformers.__version__}"
        )
    model.set_attn_implementation(name)
