"""posfair.fairness: the permutation audit of positional fairness.

:mod:`~posfair.fairness.documents` (instances, segment sets, orderings) ->
:mod:`~posfair.fairness.experiment` (encoding through the cache, observations) ->
:mod:`~posfair.fairness.analysis` (the regressions of :mod:`posfair.stats`, fidelity,
coverage) -> :mod:`~posfair.fairness.findings` (:class:`AuditFindings`: the numbers and their views) ->
:mod:`~posfair.fairness.audit_tables` / :mod:`~posfair.fairness.audit_report` (tables, figures, HTML,
files, read off the findings) -> :mod:`~posfair.fairness.audit_result` (:class:`AuditResult`: the findings with their
figures, report and files); the document families: :mod:`~posfair.fairness.families` (computing) /
:mod:`~posfair.fairness.family_report` (rendering); the language grid: :mod:`~posfair.fairness.language`
(regressions) / :mod:`~posfair.fairness.language_tables` / :mod:`~posfair.fairness.language_report`;
:mod:`~posfair.fairness.pipeline` runs it all (``audit()``, the sentence-transformers evaluator).
The attention diagnosis and the prior estimator are :mod:`posfair.attention`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.fairness.audit_result import AuditResult  # noqa: F401
    from posfair.fairness.documents import LanguageConfig, language_grid  # noqa: F401
    from posfair.fairness.experiment import AuditSettings  # noqa: F401
    from posfair.fairness.language import language_effects  # noqa: F401
    from posfair.fairness.pipeline import PositionalFairnessEvaluator, audit  # noqa: F401
    from posfair.stats.inference import FewClustersWarning, Inference  # noqa: F401
    from posfair.stats.position_ols import fit_position_ols  # noqa: F401

_EXPORTS = {
    "audit": ".pipeline",
    "PositionalFairnessEvaluator": ".pipeline",
    "AuditSettings": ".experiment",
    "AuditResult": ".audit_result",
    "LanguageConfig": ".documents",
    "language_grid": ".documents",
    "fit_position_ols": "posfair.stats.position_ols",
    "Inference": "posfair.stats.inference",
    "FewClustersWarning": "posfair.stats.inference",
    "language_effects": ".language",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.fairness", _EXPORTS)
