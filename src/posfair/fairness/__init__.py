"""posfair.fairness: the permutation audit of positional fairness, and the attention diagnosis.

Audit: :mod:`~posfair.fairness.documents` (instances, segment sets, orderings) ->
:mod:`~posfair.fairness.experiment` (encoding through the cache, observations) ->
:mod:`~posfair.fairness.ols` / :mod:`~posfair.fairness.analysis` (regressions, fidelity,
coverage) -> :mod:`~posfair.fairness.results` (:class:`AuditResult`) ->
:mod:`~posfair.fairness.tables` / :mod:`~posfair.fairness.report` (tables, figures, HTML, files);
:mod:`~posfair.fairness.evaluator` runs it (``audit()``, the sentence-transformers evaluator).

Attention: :mod:`~posfair.fairness.attention` (``attention_profile()`` runs the model) ->
:mod:`~posfair.fairness.attention_record` (the profile) / :mod:`~posfair.fairness.attention_views`
(one document's views) -> :mod:`~posfair.fairness.attention_report` (figures, report section).
"""

from posfair._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    "posfair.fairness",
    {
        "audit": ".evaluator",
        "PositionalFairnessEvaluator": ".evaluator",
        "AuditSettings": ".experiment",
        "AuditResult": ".results",
        "LanguageConfig": ".documents",
        "language_grid": ".documents",
        "fit_position_ols": ".ols",
        "Inference": ".ols",
        "FewClustersWarning": ".ols",
        "language_effects": ".language",
        "attention_profile": ".attention",
        "estimate_prior": ".attention_prior",
        "PriorEstimate": ".attention_prior",
    },
)
