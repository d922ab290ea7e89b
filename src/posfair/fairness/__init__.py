"""posfair.fairness: the permutation audit of positional fairness.

:mod:`~posfair.fairness.documents` (instances, segment sets, orderings) ->
:mod:`~posfair.fairness.experiment` (encoding through the cache, observations) ->
:mod:`~posfair.fairness.analysis` (the regressions of :mod:`posfair.stats`, fidelity,
coverage) -> :mod:`~posfair.fairness.results` (:class:`AuditResult`) ->
:mod:`~posfair.fairness.audit_tables` / :mod:`~posfair.fairness.audit_report` (tables, figures, HTML,
files); the language grid: :mod:`~posfair.fairness.language` (regressions) / :mod:`~posfair.fairness.language_tables` /
:mod:`~posfair.fairness.language_report`;
:mod:`~posfair.fairness.pipeline` runs it all (``audit()``, the sentence-transformers evaluator).
The attention diagnosis and the prior estimator are :mod:`posfair.attention`.
"""

from posfair._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    "posfair.fairness",
    {
        "audit": ".pipeline",
        "PositionalFairnessEvaluator": ".pipeline",
        "AuditSettings": ".experiment",
        "AuditResult": ".results",
        "LanguageConfig": ".documents",
        "language_grid": ".documents",
        "fit_position_ols": "posfair.stats.position_ols",
        "Inference": "posfair.stats.inference",
        "FewClustersWarning": "posfair.stats.inference",
        "language_effects": ".language",
    },
)
