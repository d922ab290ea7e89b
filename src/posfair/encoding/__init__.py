"""posfair.encoding: the one layer every area embeds texts through.

The audit's segments and documents, the retrieval queries and documents, SEA's chunks, sweeps, the tuner,
``posfair encode``, ``posfair embed``'s shards and ``posfair serve``'s requests all encode here; none of them calls
a model's ``encode`` itself.

* :mod:`~posfair.encoding.passes` -- the forward passes: stock vs calibrated, pooled vectors, token states,
  token-budget batches, pooling, L2 normalisation;
* :mod:`~posfair.encoding.batching` -- length-aware batching within a padded-token budget;
* :mod:`~posfair.encoding.model_inputs` -- the prompt, the tokenizer as ``encode`` applies it, the token limit;
* :mod:`~posfair.encoding.cache` -- dedupe -> chunk -> cache through the embedding store;
* :mod:`~posfair.encoding.evaluator_base` -- what posfair's sentence-transformers evaluators share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.encoding.batching import fixed_batches, length_aware_batches, padded_tokens, padding_waste  # noqa: F401
    from posfair.encoding.cache import cached_documents, embed_through, encode_cached, span_key  # noqa: F401
    from posfair.encoding.evaluator_base import PosfairEvaluator  # noqa: F401
    from posfair.encoding.model_inputs import (  # noqa: F401
        PromptedTokenizer,
        default_prompt,
        max_seq_length,
        model_limit,
        model_tokenizer,
    )
    from posfair.encoding.passes import (  # noqa: F401
        calibration_kwargs,
        encode_documents,
        encode_in_batches,
        encode_texts,
        encoder,
        l2_normalize,
        model_pooling,
        resolved_calibration,
        sharing_stock_layers,
        token_budget_batches,
        token_outputs,
    )

_EXPORTS = {
    **dict.fromkeys(("fixed_batches", "length_aware_batches", "padded_tokens", "padding_waste"), ".batching"),
    **dict.fromkeys(("cached_documents", "embed_through", "encode_cached", "span_key"), ".cache"),
    "PosfairEvaluator": ".evaluator_base",
    **dict.fromkeys(
        ("PromptedTokenizer", "default_prompt", "max_seq_length", "model_limit", "model_tokenizer"), ".model_inputs"
    ),
    **dict.fromkeys(
        (
            "calibration_kwargs",
            "encode_documents",
            "encode_in_batches",
            "encode_texts",
            "encoder",
            "l2_normalize",
            "model_pooling",
            "resolved_calibration",
            "sharing_stock_layers",
            "token_budget_batches",
            "token_outputs",
        ),
        ".passes",
    ),
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.encoding", _EXPORTS)
