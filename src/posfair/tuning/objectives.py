"""What the tuner optimises: objectives mapping ``(a Calibration or STOCK, split)`` to metrics.

* :class:`Objective` - the interface (``evaluate``, ``score``, ``guard``, ``calibrated_share``);
* :class:`FunctionObjective` - any function;
* :class:`FairnessObjective` - flatten the audit's σ profile, keep own-segment recall@n;
* :class:`RetrievalObjective` - raise Harm of nDCG@10 over position groups, keep nDCG@10.

The data are split once into *dev* (:data:`DEV`, searched) and *test* (:data:`TEST`,
reported) with :func:`split_ids`.  The search itself is :mod:`posfair.tuning.trials`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from posfair import encoding as enc
from posfair.attention.prior_estimate import PriorEstimate, estimate_prior
from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.calibration.coverage import calibration_coverage, quiet_fallback
from posfair.calibration.params import PositionalPrior
from posfair.fairness.analysis import fidelity_summary, fit_all
from posfair.fairness.audit_result import AuditResult
from posfair.fairness.documents import Instance
from posfair.fairness.experiment import STOCK_LABEL, AuditSettings, build_instances, make_model_info, run_instances
from posfair.fairness.measures import sets_slope
from posfair.fairness.pipeline import corpus_fingerprint
from posfair.files.run_folder import RESULT_FORMAT
from posfair.model import model_fingerprint
from posfair.model.info import display_name
from posfair.retrieval.benchmarks import RetrievalBenchmark
from posfair.retrieval.compare import harm_change
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import ProgressCallback
from posfair.store import EmbeddingStore

__all__ = [
    "DEV",
    "TEST",
    "Objective",
    "FunctionObjective",
    "FairnessObjective",
    "RetrievalObjective",
    "split_ids",
    "split_topics",
    "default_fairness_settings",
]

DEV, TEST = "dev", "test"


class Objective:
    """What the tuner optimises: ``evaluate(a Calibration or STOCK, split) -> metrics``.

    ``score``: the metric optimised (``greater_is_better`` says which way);
    ``guard``: the metric constrained (higher is better; a setting may lose at
    most ``max_drop`` of it against the stock model); ``columns``: metrics shown in
    the tables.  ``describe()`` identifies the objective (checked when resuming).
    """

    name = "objective"
    score = "score"
    greater_is_better = False
    guard = "guard"
    columns: tuple[str, ...] = ()

    def evaluate(self, calibration: Resolved, split: str) -> dict[str, float]:
        raise TypeError(f"{type(self).__name__} must define evaluate(calibration, split)")

    def calibrated_share(self, calibration: Calibration, split: str) -> float | None:
        """Fraction of the split's texts ``calibration`` changes (0 = a no-op the search skips); None = unknown."""
        return None

    def stock_layers(self) -> Any:
        """The stock layer outputs kept for the trials (``FairModel.stock_layers_keeper``: every first calibrated
        layer), made on first use from ``self.model``; None when the model cannot share them."""
        if not hasattr(self, "_stock_layers"):
            keeper = getattr(getattr(self, "model", None), "stock_layers_keeper", None)
            self._stock_layers = keeper() if keeper is not None else None
        return self._stock_layers

    def release(self) -> None:
        """Drop the stock layer outputs kept for the trials (the search is over)."""
        kept = getattr(self, "_stock_layers", None)
        if kept is not None:
            kept.release()

    #: what :meth:`guard_units` is indexed by (named in the test check)
    unit = "units"

    #: what :meth:`score_effect` measures, as the tables name it: "removed" (the share of stock's score a
    #: setting removes, for a score lower is better) or a change such as "Δharm" (a score higher is better)
    effect = "removed"

    def score_units(self, calibration: Calibration, split: str) -> list[np.ndarray] | None:
        """Per group (e.g. audit instance) the units' paired measurements of stock and ``calibration``, for the
        bootstrap interval of :meth:`score_effect`; None = the objective has none."""
        return None

    def score_effect(self, groups: list[np.ndarray]) -> float:
        """The calibration's effect on the score from :meth:`score_units`' arrays, positive = better than stock (the
        share removed, or the change of a higher-is-better score).  Called only when :meth:`score_units` gives
        arrays, whose layout only the objective knows: one that gives them defines this."""
        raise TypeError(f"{type(self).__name__} gives score_units but must define score_effect(groups) to read them")

    def format_effect(self, value: float) -> str:
        """One :meth:`score_effect` value as the tables print it (:func:`format_effect`)."""
        return format_effect(self.effect, value)

    #: whether :meth:`score_units`' arrays hold position profiles, whose slope :meth:`score_slope` reads
    has_slope = False

    def score_slope(self, groups: list[np.ndarray], column: int) -> float:
        """The profile's slope on position from :meth:`score_units`' arrays, of stock (``column`` 0) or the
        calibration (1), for objectives with :attr:`has_slope`."""
        raise TypeError(f"{type(self).__name__} has no position profile to take a slope of")

    def guard_units(self, calibration: Resolved, split: str) -> pd.Series | None:
        """The guard metric per independent unit of ``split`` (its mean is the guard), for the paired bootstrap of
        the test check; None: not available (no interval)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "score": self.score,
            "guard": self.guard,
            "greater_is_better": self.greater_is_better,
            "columns": list(self.columns),
            "result_format": RESULT_FORMAT,
        }


class FunctionObjective(Objective):
    """An objective given as a function ``fn(a Calibration or STOCK, split) -> dict of metrics``."""

    def __init__(
        self,
        fn: Callable[[Resolved, str], dict[str, float]],
        *,
        score: str = "score",
        guard: str = "guard",
        greater_is_better: bool = False,
        name: str = "function",
        identity: Any = None,
        share: Callable[[Calibration, str], float | None] | None = None,
    ):
        """``share(calibration, split)``: optional calibrated share of the split's texts (see :meth:`Objective.calibrated_share`)."""
        self.fn, self.name, self.identity, self.share = fn, name, identity, share
        self.score, self.guard, self.greater_is_better = score, guard, greater_is_better
        self.columns = (score, guard)

    def evaluate(self, calibration: Resolved, split: str) -> dict[str, float]:
        return dict(self.fn(calibration, split))

    def calibrated_share(self, calibration: Calibration, split: str) -> float | None:
        return None if self.share is None else self.share(calibration, split)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"identity": self.identity}


#: the corpus column naming each topic's document family (the bundled corpus: ``debian-faq``, ``installation-guide``)
FAMILY_COLUMN = "source"


def format_effect(effect: str, value: float) -> str:
    """A score effect as the tuner's tables print it: a share removed (``effect`` "removed") as a percentage, a
    change (e.g. "Δharm", on a 0..1 score) in points x100 with its sign."""
    return f"{value:.0%}" if effect == "removed" else f"{100 * value:+.2f}"


def corpus_families(corpus: pd.DataFrame) -> list[str]:
    """The document families of ``corpus`` (column :data:`FAMILY_COLUMN`), sorted; [] when it has none."""
    if FAMILY_COLUMN not in corpus.columns:
        return []
    return sorted(str(f) for f in corpus[FAMILY_COLUMN].dropna().unique())


def split_topics(
    corpus: pd.DataFrame, test_fraction: float, seed: int, test_family: str | None = None
) -> dict[str, list[str]]:
    """The corpus's topics (``id``) split into dev and test: no topic is on both sides.

    Without ``test_family``: a seeded split of the topics (:func:`split_ids`, ``test_fraction`` of them held out).
    With it: the test split is every topic of that document family and dev every topic of the others, so the
    setting is chosen on documents of another kind than it is tested on (run once per family to cross-validate).
    """
    if test_family is None:
        dev, test = split_ids(corpus["id"].astype(str).tolist(), test_fraction, seed)
        return {DEV: dev, TEST: test}
    families = corpus_families(corpus)
    if len(families) < 2:
        raise PosfairInputError(
            f"test family {test_family!r}: the corpus has {len(families)} document families "
            f"(column {FAMILY_COLUMN!r}); holding one out needs at least 2"
        )
    if test_family not in families:
        raise PosfairInputError(
            f"test family {test_family!r} is not in the corpus; its families: {', '.join(families)}"
        )
    ids = corpus["id"].astype(str)
    in_test = corpus[FAMILY_COLUMN].astype(str) == test_family
    test = sorted(set(ids[in_test]))
    shared = set(test) & set(ids[~in_test])
    if shared:
        raise PosfairInputError(
            f"test family {test_family!r}: {len(shared)} topic ids are in it and in another family "
            f"(e.g. {sorted(shared)[0]!r}); families must not share topics"
        )
    return {DEV: sorted(set(ids[~in_test])), TEST: test}


def _prefixed(inst: Instance, split: str) -> Instance:
    """``inst`` with its set and document ids prefixed by the split (the two splits' ids never collide)."""
    sets = [dataclasses.replace(s, set_id=f"{split}-{s.set_id}") for s in inst.sets]
    docs = [dataclasses.replace(d, set_id=f"{split}-{d.set_id}", doc_id=f"{split}-{d.doc_id}") for d in inst.documents]
    return Instance(inst.n, inst.config, sets, docs, inst.report)


def split_ids(ids: Sequence[str], test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Seeded split of unique ids into (dev, test); each side gets at least one id."""
    uniq = sorted(dict.fromkeys(ids))
    if not 0 < test_fraction < 1:
        raise PosfairInputError(f"test_fraction must be in (0, 1); got {test_fraction}")
    if len(uniq) < 2:
        raise PosfairInputError(f"need at least 2 units to split into dev and test; got {len(uniq)}")
    order = [uniq[i] for i in np.random.default_rng(seed).permutation(len(uniq))]
    k = min(len(uniq) - 1, max(1, int(round(test_fraction * len(uniq)))))
    test = sorted(order[:k])
    dev = sorted(order[k:])
    return dev, test


class FairnessObjective(Objective):
    """Flatten the σ profile (``spread``, or ``max_abs_beta``) while keeping own-segment recall@n.

    The corpus's topics (ids) are split into dev and test first (:func:`split_topics`, seeded),
    and each split's instances are drawn from its own topics (``target_docs`` shared between
    the splits by ``test_fraction``), so no segment of a test document was seen in dev: the
    test split takes no part in any choice.  Each split is measured on its own documents,
    with its own standalone segments as the pool of the fidelity measures.  Metrics are
    means over instances: ``spread``, ``max_abs_beta``, ``recall``, ``margin``,
    ``other_cos``, ``drift``, ``sigma_mean`` and ``sigma_p<k>`` (single-n audits).
    """

    name = "fairness"
    guard = "recall"
    greater_is_better = False
    columns = ("spread", "slope", "max_abs_beta", "recall", "margin", "other_cos", "drift")

    def __init__(
        self,
        model,
        corpus: pd.DataFrame,
        settings=None,
        *,
        store=None,
        score: str = "spread",
        test_fraction: float = 0.5,
        seed: int = 0,
        progress: ProgressCallback | None = None,
        test_family: str | None = None,
    ):
        """``progress(description, total, already_done)``: the audit's encoding progress (see
        :func:`posfair.fairness.experiment.run_instances`).  ``test_family``: hold out this document family
        as the test split (:func:`split_topics`) instead of ``test_fraction`` of the topics."""
        if score not in ("spread", "max_abs_beta"):
            raise PosfairInputError(f"the fairness score is 'spread' or 'max_abs_beta'; got {score!r}")
        self.score = score
        self.model = model
        self.settings = settings or default_fairness_settings()
        if not isinstance(self.settings, AuditSettings):
            raise TypeError("settings must be an AuditSettings")
        self.info = make_model_info(model, self.settings)
        self.store = store if isinstance(store, EmbeddingStore) or store is None else EmbeddingStore(store)
        self.progress = progress
        self.corpus_fingerprint = corpus_fingerprint(corpus)
        self.test_fraction, self.seed, self.test_family = test_fraction, seed, test_family
        self.instances: dict[str, list[Instance]] = {DEV: [], TEST: []}
        self.topics = split_topics(corpus, test_fraction, seed, test_family)
        if test_family is not None:  # the documents shared by the splits' topic counts
            self.test_fraction = len(self.topics[TEST]) / (len(self.topics[TEST]) + len(self.topics[DEV]))
        tokenizer = enc.model_tokenizer(model)
        for split in (DEV, TEST):
            share = self.test_fraction if split == TEST else 1 - self.test_fraction
            settings_of_split = dataclasses.replace(
                self.settings, target_docs=max(1, round(self.settings.target_docs * share))
            )
            part = corpus[corpus["id"].astype(str).isin(set(self.topics[split]))]
            for inst in build_instances(part, settings_of_split, tokenizer, self.info.limit):
                if len(inst.sets) < 2:
                    raise PosfairInputError(
                        f"instance {inst.key} has {len(inst.sets)} segment set(s) in the {split} split "
                        f"({len(self.topics[split])} topics); a split needs at least 2: raise the document count"
                    )
                self.instances[split].append(_prefixed(inst, split))

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "model": self.info.fingerprint,
            "model_name": self.info.name,
            "token_limit": self.info.limit,
            "corpus": self.corpus_fingerprint,
            "settings": self.settings.to_dict(),
            "test_fraction": self.test_fraction,
            "seed": self.seed,
            "split_by": "topic" if self.test_family is None else "family",
            "test_family": self.test_family,
        }

    def split_sets(self, split: str) -> list[str]:
        return [s.set_id for inst in self.instances[split] for s in inst.sets]

    def observations(self, calibrations: Sequence[Calibration], split: str) -> pd.DataFrame:
        """Observations of stock + ``calibrations`` on one split (through the cache)."""
        if self.store is None:
            self._tmp = getattr(self, "_tmp", None) or tempfile.TemporaryDirectory(prefix="posfair-tune-")
            self.store = EmbeddingStore(self._tmp.name)
        with quiet_fallback():  # the share is reported per trial (Trial.calibrated_share), not per encode call
            obs, _ = run_instances(
                self.model,
                self.instances[split],
                list(calibrations),
                self.store,
                self.info,
                self.settings,
                self.progress,
                stock_layers=self.stock_layers(),
            )
        return obs

    def estimate_prior(self, bins: int = 20) -> PositionalPrior:
        """The positional prior of the stock model on the *dev* split's documents, one vector per layer
        (:func:`~posfair.attention.prior_estimate.estimate_prior`; kept in :attr:`prior_estimate`)."""
        docs = [d.text for inst in self.instances[DEV] for d in inst.documents]
        self.prior_estimate: PriorEstimate = estimate_prior(
            self.model, docs, Calibration(layers=1.0), bins=bins, batch_size=self.settings.batch_size
        )
        return self.prior_estimate.calibration.prior

    def calibrated_share(self, calibration: Calibration, split: str) -> float | None:
        """Share of the split's documents ``calibration`` changes (their token counts are known: no encoding)."""
        resolve = getattr(getattr(self.model, "transformer_module", None), "resolve", None)
        if resolve is None:
            return None
        lengths = [d.n_tokens for inst in self.instances[split] for d in inst.documents]
        return calibration_coverage(resolve(calibration), lengths).share

    def evaluate(self, calibration: Resolved, split: str) -> dict[str, float]:
        obs = self.observations([] if calibration is STOCK else [calibration], split)
        label = calibration.label()
        obs = obs[(obs["calibration"] == label) & (obs["setting"] == "main")]
        fid = fidelity_summary(obs, fit_all(obs, ["sigma"], warn=False))
        out = {m: float(fid[m].mean()) for m in self.columns}
        out["sigma_mean"] = float(obs["sigma"].mean())
        if fid["n"].nunique() == 1:
            for p in range(1, int(fid["n"].iloc[0]) + 1):
                out[f"sigma_p{p}"] = float(fid[f"sigma_p{p}"].mean())
        out["documents"] = float(obs["doc_id"].nunique())
        return out

    unit = "segment sets"

    def score_units(self, calibration: Calibration, split: str) -> list[np.ndarray] | None:
        """Per instance of the split, an array (sets, 2, n): each segment set's mean σ per position under stock
        ([:, 0]) and ``calibration`` ([:, 1]) (the spread score only)."""
        if self.score != "spread":
            return None
        obs = self.observations([calibration], split)
        obs = obs[obs["setting"] == "main"]
        label = calibration.label()
        groups = []
        for _, g in obs.groupby(["n", "config"], sort=True):
            means = g.groupby(["set_id", "calibration", "position"])["sigma"].mean().unstack("position")
            sets = sorted(set(g["set_id"]))
            groups.append(np.stack([means.loc[[(s, STOCK_LABEL) for s in sets]].to_numpy(),
                                    means.loc[[(s, label) for s in sets]].to_numpy()], axis=1))  # fmt: skip
        return groups

    def score_effect(self, groups: list[np.ndarray]) -> float:
        """The share of stock's spread removed: 1 - (mean over instances of the calibrated spread) / (mean of stock's): the tuner's spread metric's ratio,
        the instance's position means taken over its (resampled) sets."""
        spreads = np.array([[np.ptp(g[:, k].mean(axis=0)) for k in (0, 1)] for g in groups])
        stock, cal = spreads.mean(axis=0)
        return float(1 - cal / stock) if stock else float("nan")

    @property
    def has_slope(self) -> bool:  # the spread score's units are the sets' σ profiles
        return self.score == "spread"

    def score_slope(self, groups: list[np.ndarray], column: int) -> float:
        """The σ slope (the tuner's ``slope`` metric) from the sets' profiles: :func:`~posfair.fairness.measures.sets_slope`."""
        return sets_slope(groups, column)

    def guard_units(self, calibration: Resolved, split: str) -> pd.Series:
        """Recall per segment set (the mean over its documents)."""
        obs = self.observations([] if calibration is STOCK else [calibration], split)
        label = calibration.label()
        obs = obs[(obs["calibration"] == label) & (obs["setting"] == "main")]
        return obs.groupby("set_id")[self.guard].mean()

    def audit_result(self, calibrations: Sequence[Calibration], split: str, corpus_name: str = "") -> AuditResult:
        """An :class:`~posfair.fairness.audit_result.AuditResult` of stock + ``calibrations`` on one split (cached)."""
        obs = self.observations(calibrations, split)
        return AuditResult(
            model=self.info.to_dict(),
            corpus={"name": f"{corpus_name} ({split} split)", "fingerprint": self.corpus_fingerprint},
            settings=self.settings.to_dict(),
            calibrations=[{"label": c.label(), "key": c.key(), **c.to_dict()} for c in calibrations],
            observations=obs,
            coefficients=fit_all(obs, [m for m in ("sigma", "tau") if obs[m].notna().any()]),
            sampling=[
                i.report.to_dict() | {"instance": i.key, "split": split, "sets_in_split": len(i.sets)}
                for i in self.instances[split]
            ],
        )


def default_fairness_settings(**overrides: Any) -> AuditSettings:
    """The tuner's audit: English, n = 3, 120 documents (20 segment sets: 10 dev, 10 test, from disjoint topics), no τ,
    no control."""
    kw: dict[str, Any] = dict(
        n_values=(3,), configs=("en",), target_docs=120, seed=0, batch_size=16, retention=False, control=False
    )
    kw.update(overrides)
    return AuditSettings(**kw)


class RetrievalObjective(Objective):
    """Raise Harm of nDCG@10 over position groups while keeping aggregate nDCG@10.

    Queries are split into dev and test by their relevant document (all queries of a
    document land in the same split); documents are encoded calibrated (the whole
    corpus is searched in both splits), queries stock.
    """

    name = "retrieval"
    score = "harm"
    greater_is_better = True
    guard = "ndcg@10"
    columns = ("harm", "psi", "ndcg@10")

    def __init__(
        self,
        model,
        benchmark,
        *,
        store=None,
        test_fraction: float = 0.5,
        seed: int = 0,
        batch_size: int = 32,
        query_prompt: str | None = "auto",
        show_progress_bar: bool | None = False,
        progress: ProgressCallback | None = None,
    ):
        """``show_progress_bar`` / ``progress``: each trial's encoding progress, as
        :class:`~posfair.retrieval.evaluator.PositionalRetrievalEvaluator` (off by default: the
        search shows one bar over the trials)."""
        if not benchmark.groups:
            raise PosfairInputError(f"benchmark {benchmark.name!r} has no positional groups: Harm needs them")
        self.model = model
        self.benchmark = benchmark
        self.store = store if isinstance(store, EmbeddingStore) or store is None else EmbeddingStore(store)
        self.batch_size = batch_size
        self.query_prompt = query_prompt
        self.show_progress_bar, self.progress = show_progress_bar, progress
        self.test_fraction, self.seed = test_fraction, seed
        self.fingerprint = model_fingerprint(model)
        self.model_name, self.token_limit = display_name(model), int(model.max_seq_length)
        self._shares: dict[str, float] = {}
        self._per_query: dict[tuple[str, str], pd.Series] = {}
        unit = [
            f"{(benchmark.query_domains or [''] * len(benchmark.query_ids))[i]}/{int(rel[0])}"
            for i, rel in enumerate(benchmark.relevant)
        ]
        dev, test = split_ids(unit, test_fraction, seed)
        self.splits = {}
        for split, ids in ((DEV, set(dev)), (TEST, set(test))):
            self.splits[split] = self._subset(np.array([u in ids for u in unit]), split)
        self.columns = ("harm", "psi", "ndcg@10", *sorted(k for k in self.splits[DEV].groups))

    def _subset(self, mask: np.ndarray, split: str) -> RetrievalBenchmark:
        b = self.benchmark
        idx = np.flatnonzero(mask)
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return RetrievalBenchmark(
            name=f"{b.name}[{split}]",
            corpus_ids=b.corpus_ids,
            corpus_texts=b.corpus_texts,
            query_ids=pick(b.query_ids),
            query_texts=pick(b.query_texts),
            qrels={b.query_ids[i]: b.qrels[b.query_ids[i]] for i in idx},
            groups={g: m[idx] for g, m in b.groups.items() if m[idx].any()},
            length_bucket=pick(b.length_bucket),
            relpos=None if b.relpos is None else b.relpos[idx],
            query_domains=pick(b.query_domains),
            corpus_domains=b.corpus_domains,
            meta=b.meta,
        )

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "model": self.fingerprint,
            "model_name": self.model_name,
            "token_limit": self.token_limit,
            "benchmark": self.benchmark.summary() | {"fingerprint": self.benchmark.fingerprint()},
            "test_fraction": self.test_fraction,
            "seed": self.seed,
        }

    def evaluate(self, calibration: Resolved, split: str) -> dict[str, float]:
        ev = PositionalRetrievalEvaluator(
            self.splits[split],
            calibration,
            store=self.store,
            batch_size=self.batch_size,
            query_prompt=self.query_prompt,
            report_fallback=False,
            show_progress_bar=self.show_progress_bar,
            progress=self.progress,
        )
        with enc.sharing_stock_layers(self.model, [], into=self.stock_layers()):  # stock runs first (the baseline)
            res = ev.evaluate(self.model)
        self._per_query[(calibration.key(), split)] = pd.Series(res.ndcg, index=res.query_ids)
        out = {k: float(v) for k, v in res.metrics.items() if k in ("harm", "psi", "ndcg@10")}
        for g, v in res.groups.items():
            out[g] = float(v)
        out["queries"] = float(len(res.query_ids))
        return out

    unit = "queries"
    effect = "Δharm"

    def score_units(self, calibration: Calibration, split: str) -> list[np.ndarray]:
        """Per positional group of the split, an array (queries, 2): each query's nDCG@10 under stock ([:, 0]) and
        ``calibration`` ([:, 1]), for Harm's change resampled within the groups (as ``posfair retrieval`` compares)."""
        bench = self.splits[split]
        a = self.guard_units(STOCK, split).reindex(bench.query_ids).to_numpy()
        b = self.guard_units(calibration, split).reindex(bench.query_ids).to_numpy()
        return [np.column_stack([a[mask], b[mask]]) for mask in bench.groups.values() if mask.any()]

    def score_effect(self, groups: list[np.ndarray]) -> float:
        """Harm(calibration) - Harm(stock) (:func:`posfair.retrieval.compare.harm_change`), positive = better."""
        return harm_change(groups)

    def guard_units(self, calibration: Resolved, split: str) -> pd.Series:
        """nDCG@10 per query (evaluated again when the trial was read back from a resumed run)."""
        key = (calibration.key(), split)
        if key not in self._per_query:
            self.evaluate(calibration, split)
        return self._per_query[key]

    def estimate_prior(self, bins: int = 20) -> PositionalPrior:
        """The positional prior of the stock model on the benchmark's documents (no queries or labels enter it),
        one vector per layer (:func:`~posfair.attention.prior_estimate.estimate_prior`)."""
        self.prior_estimate: PriorEstimate = estimate_prior(
            self.model, self.benchmark.corpus_texts, Calibration(layers=1.0), bins=bins, batch_size=self.batch_size
        )
        return self.prior_estimate.calibration.prior

    def calibrated_share(self, calibration: Calibration, split: str) -> float | None:
        """Share of the corpus documents ``calibration`` changes (both splits search the whole corpus)."""
        if not callable(getattr(self.model, "calibration_coverage", None)):
            return None
        if calibration.key() not in self._shares:
            self._shares[calibration.key()] = self.model.calibrated_share(self.benchmark.corpus_texts, calibration)
        return self._shares[calibration.key()]
