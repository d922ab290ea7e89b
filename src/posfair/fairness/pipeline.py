"""The audit as a library call and as a sentence-transformers evaluator."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posfair import encoding as enc
from posfair.calibration import Calibration
from posfair.calibration.coverage import CalibrationFallbackWarning, quiet_fallback
from posfair.corpus import corpus_content_fingerprint
from posfair.encoding.evaluator_base import PosfairEvaluator, run_tag
from posfair.fairness.analysis import coverage_messages, fit_all
from posfair.fairness.audit_result import AuditResult
from posfair.fairness.experiment import (
    AuditSettings,
    build_instances,
    default_calibrations,
    make_model_info,
    run_instances,
)
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import TqdmTasks, progress_enabled
from posfair.runtime.stacklevel import user_stacklevel
from posfair.store import EmbeddingStore

__all__ = ["audit", "corpus_fingerprint", "PositionalFairnessEvaluator"]

log = logging.getLogger(__name__)


#: the content fingerprint of a corpus (every column of every row; see posfair.corpus.corpus_content_fingerprint)
corpus_fingerprint = corpus_content_fingerprint


def audit(
    model,
    corpus: pd.DataFrame,
    settings: AuditSettings | None = None,
    calibrations: Sequence[Calibration | str] | Calibration | str = (),
    *,
    cache_dir: str | Path | None = None,
    model_name: str | None = None,
    corpus_name: str = "",
    progress: Callable[[str, int, int], Callable[[int], None] | None] | None = None,
    show_progress_bar: bool | None = None,
) -> AuditResult:
    """Run the permutation audit of ``model`` on ``corpus``; stock plus every calibration.

    ``cache_dir``: the embedding cache (None = a temporary one, deleted afterwards).
    ``progress(description, total, done)``: called when the texts of one instance and variant
    start (``done`` of ``total`` already cached); it may return a ``tick(k)`` called as ``k``
    more are encoded (how the CLI drives its bars).  Without it, ``show_progress_bar`` shows a
    tqdm bar per instance and variant; None = shown when this module's logger is at INFO or
    DEBUG (as sentence-transformers does).  What is encoded, and what came from the cache, is
    logged at INFO.
    """
    settings = settings or AuditSettings()
    cals = default_calibrations(calibrations)
    info = make_model_info(model, settings, model_name)
    if cals and info.pooling not in ("cls", "mean", "lasttoken"):
        raise PosfairInputError(
            f"calibration needs cls, mean or last-token pooling; the model pools with {info.pooling!r}"
        )
    t0 = time.perf_counter()
    instances = build_instances(corpus, settings, enc.model_tokenizer(model), info.limit)
    log.info(
        "audit of %s: %d instances (%s documents) x %d variants (stock + %s)",
        info.name,
        len(instances),
        sum(len(i.documents) for i in instances),
        1 + len(cals),
        [c.label() for c in cals] or "no calibration",
    )
    with (
        _cache_root(cache_dir) as root,
        _progress_callback(progress, show_progress_bar) as progress_cb,
        quiet_fallback(),  # reported once per calibration below (and in every table), not per encode call
    ):
        obs, timings = run_instances(model, instances, cals, EmbeddingStore(root), info, settings, progress_cb)
    coefs = fit_all(obs, [m for m in ("sigma", "tau") if obs[m].notna().any()], settings.inference_spec)
    timings["total"] = time.perf_counter() - t0
    langs = sorted(corpus["lang"].astype(str).unique()) if "lang" in corpus else []
    result = AuditResult(
        model=info.to_dict(),
        corpus={
            "name": corpus_name,
            "fingerprint": corpus_fingerprint(corpus),
            "rows": int(len(corpus)),
            "languages": ", ".join(langs),
        },
        settings=settings.to_dict(),
        calibrations=[{"label": c.label(), "key": c.key(), **c.to_dict()} for c in cals],
        observations=obs,
        coefficients=coefs,
        sampling=[i.report.to_dict() | {"instance": i.key} for i in instances],
        timings=timings,
    )
    for message in coverage_messages(result.coverage()):
        warnings.warn(message, CalibrationFallbackWarning, stacklevel=user_stacklevel())
    return result


@contextlib.contextmanager
def _cache_root(cache_dir: str | Path | None) -> Iterator[str | Path]:
    """``cache_dir``, or a temporary directory deleted afterwards."""
    if cache_dir is not None:
        yield cache_dir
        return
    with tempfile.TemporaryDirectory(prefix="posfair-cache-") as root:
        log.debug("temporary embedding cache %s", root)
        yield root


@contextlib.contextmanager
def _progress_callback(progress, show_progress_bar: bool | None) -> Iterator[Any]:
    """The caller's ``progress``, else tqdm bars when they are to be shown, else None."""
    if progress is not None or not progress_enabled(show_progress_bar, log):
        yield progress
        return
    with TqdmTasks() as bars:
        yield bars


class PositionalFairnessEvaluator(PosfairEvaluator):
    """Positional-fairness audit as a sentence-transformers evaluator.

    Built from a corpus and settings; ``evaluator(model)`` returns a dict of headline
    numbers (prefixed with ``name``); the primary metric is the mean beta_p
    (p >= 2) of sigma for the stock model (closer to 0 = fairer; higher is better),
    ``evaluator.primary_metric`` (e.g. ``"posfair_stock_main_sigma_mean_later_beta"``).
    Each calibration in ``calibrations`` adds the same figures under its label, e.g.
    ``"posfair_B128-L0.5-a0.5_main_sigma_mean_later_beta"``.  The audit always runs the
    stock model plus ``calibrations``: a default calibration the model carries
    (``model.set_calibration``) is not applied implicitly; pass it (``[model.calibration]``)
    to audit the model as it encodes.
    The full :class:`AuditResult` of the last call is ``evaluator.last_result``.
    With ``output_path`` the results are saved to ``output_path/<name>_epoch<e>_steps<s>``.

    By default the evaluator uses a fresh temporary cache per call, which is what
    a training loop needs (weights change between calls); pass ``cache_dir`` to
    reuse embeddings across calls of an unchanged model.  ``show_progress_bar``: as for :func:`audit`.
    """

    def __init__(
        self,
        corpus: pd.DataFrame,
        settings: AuditSettings | None = None,
        calibrations: Sequence[Calibration | str] | Calibration | str = (),
        *,
        name: str = "posfair",
        cache_dir: str | Path | None = None,
        write_report: bool = True,
        show_progress_bar: bool | None = None,
    ):
        super().__init__()
        if not isinstance(corpus, pd.DataFrame):
            raise PosfairInputError(
                f"the corpus must be a pandas DataFrame (posfair.corpus.load_corpus); got {type(corpus).__name__}"
            )
        if settings is not None and not isinstance(settings, AuditSettings):
            raise PosfairInputError(f"settings must be an AuditSettings; got {type(settings).__name__}")
        self.corpus = corpus
        self.settings = settings or AuditSettings()
        self.calibrations = default_calibrations(calibrations)
        self.name = self._check_name(name)
        self.cache_dir = cache_dir
        self.write_report = write_report
        self.show_progress_bar = show_progress_bar
        self.base_metric = "stock_main_sigma_mean_later_beta"
        self.greater_is_better = True
        self.last_result: AuditResult | None = None

    def __call__(self, model, output_path: str | None = None, epoch: float = -1, steps: int = -1) -> dict[str, float]:
        result = audit(
            model,
            self.corpus,
            self.settings,
            self.calibrations,
            cache_dir=self.cache_dir,
            show_progress_bar=self.show_progress_bar,
        )
        self.last_result = result
        if output_path is not None and self.write_report:
            result.save(Path(output_path) / f"{self.name}{run_tag(epoch, steps)}")
        return self.finish(model, result.headline(), epoch, steps)

    @property
    def description(self) -> str:
        return "Positional fairness"

    def get_config_dict(self) -> dict[str, Any]:
        return {"settings": self.settings.to_dict(), "calibrations": [c.label() for c in self.calibrations]}
