"""The tuner as a library call (:func:`tune`) and in the sentence-transformers evaluator style."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.encoding.evaluator_base import PosfairEvaluator, run_tag
from posfair.files.atomic import atomic_write_text
from posfair.files.run_folder import RunFolder
from posfair.model import FairModel, token_limit
from posfair.retrieval.benchmarks import RetrievalBenchmark, build_from_corpus, load_benchmark
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import ProgressCallback
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import EmbeddingStore
from posfair.tuning.objectives import (
    FairnessObjective,
    Objective,
    RetrievalObjective,
    default_fairness_settings,
    split_topics,
)
from posfair.tuning.outputs import save_tuned_model, summary_markdown, write_outputs
from posfair.tuning.space import SearchSpace
from posfair.tuning.trials import RESULTS_FILE, run_search
from posfair.tuning.tune_result import TuneResult
from posfair.tuning.verdicts import ConstraintWarning

__all__ = ["tune", "make_objective", "build_corpus_benchmark", "CalibrationTuner"]


def build_corpus_benchmark(
    model: FairModel, corpus: pd.DataFrame, out_dir: str | Path, *, lang: str = "en", k: int = 3, seed: int = 0
) -> RetrievalBenchmark:
    """A position-aware benchmark built from an aligned corpus (titles as queries), saved in ``out_dir`` and loaded."""
    limit = token_limit(model)
    path = build_from_corpus(
        corpus,
        out_dir,
        langs=[lang],
        k=k,
        seed=seed,
        max_doc_tokens=limit - model.special_token_count(),
        max_seq_length=limit,
        count_tokens=lambda texts: model.token_lengths(texts, add_special_tokens=False).tolist(),
    )
    return load_benchmark(str(path), lang=lang)


def check_objective(objective: str | Objective, corpus: pd.DataFrame | None, benchmark, score: str | None) -> None:
    """Refuse an objective and its data that cannot work, before any work starts (:func:`make_objective`;
    :class:`CalibrationTuner` at construction, not at its first call, in a trainer after the first steps)."""
    if isinstance(objective, Objective):
        return
    if objective == "fairness":
        if corpus is None:
            raise PosfairInputError("the fairness objective needs a corpus")
        if score not in (None, "spread", "max_abs_beta"):
            raise PosfairInputError(f"the fairness score is 'spread' or 'max_abs_beta'; got {score!r}")
    elif objective == "retrieval":
        if benchmark is None and corpus is None:
            raise PosfairInputError("the retrieval objective needs a benchmark or a corpus to build one from")
        if score not in (None, "harm"):
            raise PosfairInputError(f"the retrieval objective optimises Harm; got score={score!r}")
    else:
        raise PosfairInputError(f"objective must be 'fairness', 'retrieval' or an Objective; got {objective!r}")


def make_objective(
    model,
    objective: str = "fairness",
    *,
    corpus: pd.DataFrame | None = None,
    benchmark=None,
    settings=None,
    score: str | None = None,
    store: EmbeddingStore | None = None,
    test_fraction: float = 0.5,
    seed: int = 0,
    work_dir: str | Path | None = None,
    lang: str = "en",
    progress: ProgressCallback | None = None,
    test_family: str | None = None,
) -> Objective:
    """A :class:`FairnessObjective` (needs ``corpus``) or :class:`RetrievalObjective` (``benchmark``, or one built from
    ``corpus``).  ``test_family``: the fairness objective's held-out document family (instead of ``test_fraction``)."""
    if isinstance(objective, Objective) or objective not in ("fairness", "retrieval"):
        raise PosfairInputError(f"objective must be 'fairness' or 'retrieval'; got {objective!r}")
    check_objective(objective, corpus, benchmark, score)
    if test_family is not None and objective != "fairness":
        raise PosfairInputError(
            f"test family {test_family!r}: a held-out family applies to the fairness objective only"
        )
    if objective == "fairness":
        return FairnessObjective(
            model,
            corpus,
            settings,
            store=store,
            score=score or "spread",
            test_fraction=test_fraction,
            seed=seed,
            progress=progress,
            test_family=test_family,
        )
    if benchmark is None:
        if work_dir is None:
            raise PosfairInputError("building a benchmark from the corpus needs a work directory")
        benchmark = build_corpus_benchmark(model, corpus, Path(work_dir) / "benchmark", lang=lang, seed=seed)
    return RetrievalObjective(model, benchmark, store=store, test_fraction=test_fraction, seed=seed)


def tune(
    model,
    corpus: pd.DataFrame | None = None,
    *,
    objective: str | Objective = "fairness",
    benchmark=None,
    settings=None,
    space: SearchSpace | None = None,
    max_drop: float = 0.02,
    score: str | None = None,
    test_fraction: float = 0.5,
    seed: int = 0,
    out_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    save_model: str | Path | None = None,
    lang: str = "en",
    log: Callable[[str], None] | None = None,
    show_progress_bar: bool | None = None,
    test_family: str | None = None,
    save_anyway: bool = False,
) -> TuneResult:
    """Choose a calibration for ``model`` (see :func:`posfair.tuning.trials.run_search`).

    With ``out_dir`` the run is resumable (``tune.json``, embeddings in ``cache_dir`` or
    ``out_dir/cache``) and the tables, figure and summary are written there; with
    ``save_model`` the model is saved there with the chosen calibration persisted -- unless the chosen setting
    fails on the held-out test split (:meth:`TuneResult.failures`: the constraint broken, or the σ profile
    reversed beyond noise): then nothing is saved, a :class:`ConstraintWarning` says why and
    ``result.save_refused`` holds the reason (``save_anyway=True`` saves it all the same).  ``lang``: the
    language of a retrieval benchmark built from ``corpus`` (the fairness audit's come with ``settings``).
    ``log`` / ``show_progress_bar``: as :func:`~posfair.tuning.trials.run_search`.  ``test_family``: hold out
    this document family of ``corpus`` as the test split (fairness objective; run once per family to
    cross-validate across families).
    """
    with tempfile.TemporaryDirectory(prefix="posfair-tune-") as tmp:
        work = Path(out_dir) if out_dir is not None else Path(tmp)
        store = EmbeddingStore(cache_dir or work / "cache")
        obj = (
            objective
            if isinstance(objective, Objective)
            else make_objective(
                model,
                objective,
                corpus=corpus,
                benchmark=benchmark,
                settings=settings,
                score=score,
                store=store,
                test_fraction=test_fraction,
                seed=seed,
                work_dir=work,
                lang=lang,
                test_family=test_family,
            )
        )
        trial_log: list[str] = []

        def keep(line: str) -> None:  # every trial line, for TRIAL_LOG; passed on to ``log``
            trial_log.append(line)
            if log is not None:
                log(line)

        with _run_folder(work, obj, space, max_drop, store, out_dir):
            result = run_search(
                obj,
                space,
                max_drop=max_drop,
                results_path=work / RESULTS_FILE if out_dir is not None else None,
                log=keep,
                show_progress_bar=show_progress_bar,
            )
            if out_dir is not None:
                _write_run_outputs(result, obj, out_dir)
                atomic_write_text(Path(out_dir) / TRIAL_LOG, "".join(line + "\n" for line in trial_log))
        getattr(obj, "release", lambda: None)()  # the stock layers kept for the trials
    _save_chosen(model, obj, result, save_model, save_anyway)
    if save_model is not None and out_dir is not None:  # the summary says whether the model was saved
        atomic_write_text(Path(out_dir) / "summary.md", summary_markdown(result))
    return result


#: the trial log of a run with ``out_dir``: every line the search says (``log``), one per trial and verdict
TRIAL_LOG = "trials.log"


def _run_folder(work: Path, obj: Objective, space: SearchSpace | None, max_drop: float, store: EmbeddingStore, out_dir):
    """The resumable run folder of :func:`tune` (keyed by the objective, the space and the constraint), or a context
    that does nothing without ``out_dir``."""
    if out_dir is None:
        return contextlib.nullcontext()
    return RunFolder(
        work,
        "tune",
        {"objective": obj.describe(), "space": (space or SearchSpace()).to_dict(), "max_drop": max_drop},
        state=["cache", store.root, "benchmark"],
    )


def _write_run_outputs(result: TuneResult, obj: Objective, out_dir: str | Path) -> None:
    """The tables, figure and summary in ``out_dir``; with the fairness objective also the chosen calibration's audit
    on the test split (``test_audit``)."""
    write_outputs(result, out_dir)
    if isinstance(obj, FairnessObjective):
        cals = [] if result.chosen is STOCK else [result.chosen]
        obj.audit_result(cals, "test", corpus_name="tuning").save(
            Path(out_dir) / "test_audit", title="Tuned calibration on the test split"
        )


def _save_chosen(model, obj: Objective, result: TuneResult, save_model, save_anyway: bool) -> None:
    """With ``save_model``: the model saved with the chosen calibration, unless it fails on the held-out test split
    and not ``save_anyway`` (then a :class:`ConstraintWarning` and ``result.save_refused`` say why)."""
    failed = result.failures()
    if save_model is not None and failed and not save_anyway:
        result.save_refused = f"{result.chosen_label} fails on the held-out test split: " + "; ".join(failed)
        warnings.warn(
            f"tuned model not saved to {save_model}: {result.save_refused} (save_anyway=True / --save-model-anyway "
            "saves it all the same)",
            ConstraintWarning,
            stacklevel=user_stacklevel(),
        )
    elif save_model is not None:
        # saved with the token limit the search encoded at, so that the folder reproduces the tuner's embeddings
        info = getattr(obj, "info", None)
        with enc.max_seq_length(model, info.limit if info is not None else model.max_seq_length):
            save_tuned_model(model, result.chosen, save_model)
        result.saved_model = str(save_model)


class CalibrationTuner(PosfairEvaluator):
    """The tuner in the evaluator style: ``tuner(model) -> dict`` of dev and test figures (prefixed with ``name``).

    ``objective``: "fairness" (needs ``corpus``), "retrieval" (``benchmark`` or ``corpus``) or
    an :class:`Objective`.  The primary metric is the chosen setting's score on the test split.  The full
    :class:`TuneResult` of the last call is ``tuner.last_result``.  ``primary_metric`` is
    ``f"{name}_test_chosen_{score}"``; ``greater_is_better`` follows the objective (the fairness
    scores, spread and max |beta|: lower is better; the retrieval score, Harm: higher is better).
    ``test_family``: hold out this document family of ``corpus`` as the test split (fairness objective; the
    families are the corpus's ``source`` column), as :func:`tune`.
    """

    def __init__(
        self,
        corpus: pd.DataFrame | None = None,
        *,
        objective: str | Objective = "fairness",
        benchmark=None,
        settings=None,
        space: SearchSpace | None = None,
        max_drop: float = 0.02,
        score: str | None = None,
        test_fraction: float = 0.5,
        seed: int = 0,
        test_family: str | None = None,
        cache_dir: str | Path | None = None,
        name: str = "tune",
        show_progress_bar: bool | None = None,
    ):
        super().__init__()
        check_objective(objective, corpus, benchmark, score)
        self.show_progress_bar = show_progress_bar
        self.corpus, self.objective, self.benchmark = corpus, objective, benchmark
        self.settings = settings if settings is not None or objective != "fairness" else default_fairness_settings()
        self.space, self.max_drop, self.score_name = space or SearchSpace(), max_drop, score
        if test_family is not None:  # refused here, before any model is encoded, as tune() would refuse it
            if objective != "fairness":
                raise PosfairInputError(
                    f"test family {test_family!r}: a held-out family applies to the fairness objective only"
                )
            split_topics(corpus, test_fraction, seed, test_family)
        self.test_family = test_family
        self.test_fraction, self.seed, self.cache_dir, self.name = (
            test_fraction,
            seed,
            cache_dir,
            self._check_name(name),
        )
        if isinstance(objective, Objective):
            score, self.greater_is_better = objective.score, bool(objective.greater_is_better)
        else:
            score, self.greater_is_better = (
                score or ("harm" if objective == "retrieval" else "spread"),
                objective == "retrieval",
            )
        self.base_metric = f"test_chosen_{score}"
        self.last_result: TuneResult | None = None

    def __call__(self, model, output_path: str | None = None, epoch: float = -1, steps: int = -1) -> dict[str, float]:
        tag = run_tag(epoch, steps)
        result = tune(
            model,
            self.corpus,
            objective=self.objective,
            benchmark=self.benchmark,
            settings=self.settings,
            space=self.space,
            max_drop=self.max_drop,
            score=self.score_name,
            test_fraction=self.test_fraction,
            seed=self.seed,
            test_family=self.test_family,
            out_dir=None if output_path is None else Path(output_path) / f"{self.name}{tag}",
            cache_dir=self.cache_dir,
            show_progress_bar=self.show_progress_bar,
        )
        self.last_result = result
        return self.finish(model, result.headline(), epoch, steps)

    @property
    def description(self) -> str:
        return "Calibration tuning"

    def get_config_dict(self) -> dict[str, Any]:
        name = self.objective.name if isinstance(self.objective, Objective) else self.objective
        return {
            "objective": name,
            "space": self.space.to_dict(),
            "max_drop": self.max_drop,
            "test_family": self.test_family,
        }
