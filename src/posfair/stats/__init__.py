"""posfair.stats: the statistics behind every interval and p-value posfair reports (numpy, scipy, statsmodels).

:mod:`~posfair.stats.clusters` (which observations are dependent: cluster structures, clustered OLS, the joint fit
and the ``conservative`` choice) -> :mod:`~posfair.stats.inference` (:class:`~posfair.stats.inference.Inference`:
CR1 + t(G-1) or the wild bootstrap; significance marks and the sentences that describe them) ->
:mod:`~posfair.stats.wild` (the wild cluster bootstrap-t) -> :mod:`~posfair.stats.position_ols` (OLS on position
dummies, the audit's per-instance regression); :mod:`~posfair.stats.intervals` (the paired bootstrap of every
comparison, and an interval judged against a limit).

Pure statistics: nothing here imports a pipeline (fairness, tuning, retrieval); the tables and wording about an audit
or a search live in those pipelines.  This package's ``__init__`` imports nothing, so ``posfair.stats.intervals``
(numpy only) stays light.
"""
