"""posfair.attention: the pooling token's attention, measured, and the positional prior estimated from it.

:mod:`~posfair.attention.profile` (``attention_profile()`` runs the model and records the
pooling token's attention rows) -> :mod:`~posfair.attention.record` (the profile: sums over
documents, saved and loaded) / :mod:`~posfair.attention.views` (one document's views: absolute
baskets, relative bins, segments, special tokens) -> :mod:`~posfair.attention.render` (figures,
the report section).  :mod:`~posfair.attention.prior_estimate` estimates the positional prior that the
``prior`` calibration variant divides by (``estimate_prior()``), from the same recorded rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.attention.prior_estimate import PriorEstimate, estimate_prior  # noqa: F401
    from posfair.attention.profile import attention_profile, resolve_layers  # noqa: F401
    from posfair.attention.record import AttentionProfile  # noqa: F401
    from posfair.attention.render import write_attention_report  # noqa: F401

_EXPORTS = {
    "attention_profile": ".profile",
    "resolve_layers": ".profile",
    "AttentionProfile": ".record",
    "write_attention_report": ".render",
    "estimate_prior": ".prior_estimate",
    "PriorEstimate": ".prior_estimate",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.attention", _EXPORTS)
