"""posfair's position-aware retrieval benchmarks as MTEB 2.x tasks, measured with posfair's protocol.

Three pieces, meant to be used together::

    import mteb
    import posfair.mteb

    tasks = posfair.mteb.tasks("bench")                       # a benchmark folder, name or RetrievalBenchmark
    results = mteb.evaluate(posfair.mteb.encoder(model, cal), tasks, cache=None)
    scores = posfair.mteb.position_scores(results, tasks)     # nDCG@10 per group, Harm, PSI

* :func:`tasks` (:mod:`~posfair.mteb.task`, subsets in :mod:`~posfair.mteb.subsets`) turns a :class:`~posfair.retrieval.benchmarks.RetrievalBenchmark`
  (or anything :func:`~posfair.retrieval.benchmarks.load_benchmark` accepts: a
  benchmark built by :func:`~posfair.retrieval.benchmarks.build_from_corpus`, a
  local copy of PosIR, SQuAD-PosQ or FineWeb-PosQ) into MTEB retrieval tasks that
  hold their data in memory: nothing is read from the hub.
* :func:`encoder` (:mod:`~posfair.mteb.protocol`) wraps a model for MTEB with posfair's protocol: documents are
  encoded with the setting under test (stock or a :class:`~posfair.Calibration`),
  queries always with the stock model, every embedding L2-normalised and scored by
  inner product (cosine), as :class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator`
  does.  MTEB's per-group nDCG@10 then equals posfair's.
* :func:`position_scores` (:mod:`~posfair.mteb.scores`) reads what ``mteb.evaluate`` returns and gives, per task,
  nDCG@10 per group and Harm and PSI computed with :mod:`posfair.retrieval.metrics`
  (the evaluator's own definitions).

**One MTEB subset per group.**  Each answer-position group (``seg 1``, ``seg 2``, ...
of a built benchmark, ``0+`` ... ``500+`` of SQuAD-PosQ, ``begin`` / ``middle`` /
``end`` of FineWeb-PosQ) is one ``hf_subset`` of the task's single ``test`` split,
holding the group's queries and the whole corpus.  Subsets, not splits, because
subsets are how MTEB reports parallel slices of one task: each gets its own row
(``hf_subset``) in ``TaskResult.scores["test"]``, its own ``main_score`` (nDCG@10)
and its own entry in ``to_dataframe()``, a run can be restricted to some of them, and
MTEB's aggregate (``TaskResult.get_score()``) averages them.  Splits mean
train / dev / test partitions to MTEB: results tables and leaderboards read the
evaluation split, and a task with six "test-like" splits would be reported as six
evaluation regimes of one task.  Groups may overlap (SQuAD-PosQ's inclusive bounds,
FineWeb-PosQ's multi-part answers); a query then sits in every subset of its groups,
as in posfair.  A group without queries cannot be scored by MTEB: it is left out with
a :class:`MissingGroupWarning` and reported as NaN, as posfair's evaluator does.

For PosIR-style benchmarks without groups (the published PosIR) ``grouping="relpos"``
gives one subset per (length bucket, relative-position bin) with queries, named
``Q1.bin00`` ... ``Q4.bin19``, plus ``Q1.unbinned`` ... for the queries of a bucket
without a relative position; :func:`position_scores` rebuilds posfair's per-bucket
nDCG@10 (query-weighted over the bucket's subsets) and PSI over the bins.  When a
benchmark has several domains (each with its own corpus), every query is ranked only
against its own domain's documents (MTEB's ``top_ranked`` candidates), as posfair
searches each domain separately.

**Relevance** is graded as in posfair (a qrel score > 0 is relevant, its score is its gain);
MTEB scores with pytrec_eval, which takes integer scores only, so :func:`tasks` refuses a benchmark
with a fractional score.
MTEB strips leading and trailing white space from documents before encoding them;
:func:`tasks` warns when a document has any (its tokens, and so its embedding, may
then differ from posfair's).

**MTEB's result cache.**  ``mteb.evaluate`` stores every result under the model's
name, revision and ``experiment_kwargs`` and, by default
(``overwrite_strategy="only-missing"``), returns a stored result instead of running
again.  Task names carry a hash of the benchmark's content, so a different benchmark
never reuses another's results.  :func:`encoder` records the document setting
(``stock`` or the calibration), the stock queries and the token limit in the model's
``experiment_kwargs``, so stock and calibrated runs are stored apart.  A calibrated
:class:`~posfair.FairModel` passed to ``mteb.evaluate`` directly is known to MTEB
only by its name: pass ``cache=None`` (or ``overwrite_strategy="always"``), or MTEB
silently returns the results of an earlier stock run of the same model.

**A FairModel passed directly.**  ``mteb.evaluate(model, tasks)`` wraps a
SentenceTransformer in MTEB's own wrapper, which encodes through
``encode_query`` / ``encode_document``; a FairModel does not support those on
sentence-transformers 6.x, and they would calibrate queries as well.  posfair's tasks
therefore evaluate a FairModel that arrives that way through :func:`encoder` (its
default calibration on documents, queries stock, the prompts MTEB resolved, MTEB's
record of the model), so the protocol is the same either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.mteb.protocol import PositionalEncoder, encoder  # noqa: F401
    from posfair.mteb.scores import PositionScores, position_scores  # noqa: F401
    from posfair.mteb.subsets import MAIN_SCORE, SPLIT, MissingGroupWarning  # noqa: F401
    from posfair.mteb.task import GROUPINGS, PositionalRetrievalTask, benchmark_digest, tasks  # noqa: F401

_EXPORTS = {
    "PositionalEncoder": ".protocol",
    "encoder": ".protocol",
    "PositionScores": ".scores",
    "position_scores": ".scores",
    "MAIN_SCORE": ".subsets",
    "SPLIT": ".subsets",
    "MissingGroupWarning": ".subsets",
    "GROUPINGS": ".task",
    "PositionalRetrievalTask": ".task",
    "benchmark_digest": ".task",
    "tasks": ".task",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.mteb", _EXPORTS)
__all__ = [n for n in __all__ if n not in ("MAIN_SCORE", "SPLIT")]  # importable from posfair.mteb, not public
