"""Choosing a calibration: grid search with a fine strength search, a constraint, a Pareto front, a held-out test.

The search runs on the *dev* split only:

1. the stock model (strength 0) gives the reference of the constraint;
2. the coarse grid basket size x layer set x strength;
3. the fine strength search: on the (basket size, layer set) line of the best
   coarse setting (the best feasible one; if none is feasible, the best-scoring
   one), each round evaluates the midpoints between the line's best strength and
   its evaluated neighbours (strength 0 = stock), for ``fine_rounds`` rounds.

A grid or fine point whose calibration changes none of the split's texts
(calibrated share 0: every document shorter than one basket, or exactly one;
:mod:`posfair.calibration.coverage`) is *skipped*: not evaluated, not a
candidate, listed in :attr:`TuneResult.skipped` and in the report.

Variants (``SearchSpace.variants``, see :class:`~posfair.Calibration`): every grid
point (basket size, layer set, strength) is tried as each variant -- ``uniform`` (the
papers' equal mass per basket), ``prior`` (positional-prior calibration; the prior is
estimated once on the dev split by the objective, per layer for every layer of the model,
and stored in each trial's calibration), ``self`` (one point per ``self_shares`` value)
and ``special`` (one point per ``special_shares`` value), or a combination of them named
with ``+`` (``prior+special``, ``self+special``, ...: one point per pairing of its parts'
values).  ``trailings`` adds the short-last-basket policy (``Calibration.trailing``) and ``schedules``
the per-layer strength schedule (``Calibration.schedule``) as grid dimensions.  The fine strength search
then runs on the best line of *each* variant (a line = every field but the strength),
the Pareto front is computed over all dev trials and per variant
(:attr:`TuneResult.fronts`), and the chosen setting is the best feasible one over all
variants.  On the test split, stock, the chosen setting and each variant's best feasible
dev setting are evaluated (the per-variant confirmation; none of them influences the choice).

A setting is *feasible* when its guard metric (own-segment recall@n for the
fairness objective, aggregate nDCG@10 for retrieval) drops by at most
``max_drop`` below the stock model's on the dev split.  The chosen setting is the
best-scoring feasible one (stock if none beats it); ties go to the lower strength.
Only then are the stock model and the chosen setting evaluated on the *test* split,
which therefore never influences the choice.

Objectives (:mod:`posfair.tuning.objectives`: :class:`FairnessObjective`,
:class:`RetrievalObjective`, or any :class:`Objective`, e.g. :class:`FunctionObjective`
wrapping a function) map ``(a Calibration or STOCK, split)`` to a dict of metrics.  Every trial is appended to
``tune.json`` (written atomically after each configuration) and every embedding
goes through the :class:`~posfair.store.EmbeddingStore`, so a killed run resumes
where it stopped and a re-run computes nothing.

The search logs each trial through :mod:`logging` (INFO) and, like sentence-transformers,
shows a tqdm bar over the trials when ``show_progress_bar`` is True (None: when this
module's logger is at INFO or DEBUG).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Resolved
from posfair.calibration.coverage import NOOP_LABEL
from posfair.files.atomic import atomic_write_json
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.progress import progress_enabled
from posfair.runtime.stacklevel import user_stacklevel
from posfair.tuning.front import pareto_front
from posfair.tuning.objectives import DEV, TEST, Objective
from posfair.tuning.space import SearchSpace, Trial, round_strength
from posfair.tuning.tune_result import TuneResult
from posfair.tuning.verdicts import (
    ConstraintWarning,
    check_test_constraint,
    meets_constraint,
    test_score_effect,
    trial_intervals,
)

__all__ = ["RESULTS_FILE", "run_search"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "tune.json"


def _load_trials(path: Path, objective: dict[str, Any]) -> list[Trial]:
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    old = json.loads(json.dumps(saved.get("objective"), default=str))
    new = json.loads(json.dumps(objective, default=str))
    if old != new:
        old = old if isinstance(old, dict) else {}
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise PosfairInputError(
            f"{path} holds a search of a different objective, model or data (differs in: {', '.join(differ)}); "
            "its trials cannot be reused: use another output directory"
        )
    return [Trial.from_dict(d) for d in saved.get("trials", [])]


class _Search:
    """The state of one search: the trials so far (evaluated or read back from ``tune.json``), the skipped
    no-op grid points, the progress bar and the log; :meth:`trial` evaluates one configuration on one split."""

    def __init__(
        self,
        objective: Objective,
        space: SearchSpace,
        max_drop: float,
        path: Path | None,
        log: Callable[[str], None] | None,
        show_progress_bar: bool | None,
        total: int,
    ):
        self.objective, self.space, self.max_drop, self.path, self.log = objective, space, max_drop, path, log
        self.desc = objective.describe()
        self.done = {(t.key, t.split): t for t in (_load_trials(path, self.desc) if path else [])}
        self.trials: list[Trial] = []
        self.skipped: list[Trial] = []
        self.sign = 1.0 if objective.greater_is_better else -1.0
        self.bar = tqdm(
            total=total, desc="tuning trials", unit="trial", disable=not progress_enabled(show_progress_bar, logger)
        )
        self.stock: Trial | None = None

    def say(self, msg: str) -> None:
        logger.info(msg)
        if self.log is not None:
            self.log(msg)

    def save(self, extra: dict[str, Any] | None = None) -> None:
        """``tune.json`` rewritten atomically: every trial so far (a killed search loses no finished trial)."""
        if self.path is not None:
            body = {
                "objective": self.desc,
                "space": self.space.to_dict(),
                "max_drop": self.max_drop,
                "trials": [t.to_dict() for t in self.trials],
                "skipped": [t.to_dict() for t in self.skipped],
            }
            atomic_write_json(self.path, body | (extra or {}))

    def _known(self, key: tuple[str, str]) -> tuple[bool, Trial | None]:
        for t in self.trials:
            if (t.key, t.split) == key:
                return True, t
        return any((t.key, t.split) == key for t in self.skipped), None

    def trial(self, cal: Resolved, split: str, phase: str) -> Trial | None:
        """The trial of ``cal`` on ``split`` (evaluated, or read back); None for a no-op calibration (skipped)."""
        key = (cal.key(), split)
        known, t = self._known(key)
        if known:
            return t
        share = None if cal is STOCK else self.objective.calibrated_share(cal, split)
        if (
            share is not None and share == 0 and phase in ("coarse", "fine")
        ):  # the test split reports the choice whatever it is
            self.skipped.append(Trial(cal, split, "skipped", {}, 0.0, 0.0))
            self._record(f"{split:>4} {phase:<6} {cal.label():<22} skipped: {NOOP_LABEL} (calibrated share 0)")
            return None
        t = self._read_back(key, phase, share) if key in self.done else self._evaluate(cal, split, phase, share)
        self.trials.append(t)
        shown = "" if share is None else f", calibrated share {share:.3f}"
        o = self.objective
        self._record(
            f"{split:>4} {phase:<6} {t.label:<22} {o.score}={t.metrics[o.score]:.4f} {o.guard}={t.metrics[o.guard]:.4f}{shown}"
        )
        return t

    def _read_back(self, key: tuple[str, str], phase: str, share: float | None) -> Trial:
        t = self.done[key]
        t.phase = phase
        if t.calibrated_share is None:
            t.calibrated_share = share
        return t

    def _evaluate(self, cal: Resolved, split: str, phase: str, share: float | None) -> Trial:
        o = self.objective
        s0 = time.perf_counter()
        metrics = o.evaluate(cal, split)
        for name in (o.score, o.guard):
            if name not in metrics:
                raise PosfairInputError(f"objective {o.name!r} returned no {name!r} metric (got {sorted(metrics)})")
        return Trial(cal, split, phase, {k: float(v) for k, v in metrics.items()}, time.perf_counter() - s0, share)

    def _record(self, line: str) -> None:
        self.save()
        self.bar.update()
        self.say(line)

    # -- the choice rule (the test check uses the same meets_constraint) --------------------------
    def feasible(self, t: Trial) -> bool:
        return t.stock or meets_constraint(
            t.metrics[self.objective.guard], self.stock.metrics[self.objective.guard], self.max_drop
        )

    def rank(self, t: Trial) -> tuple[float, float]:
        """Smaller is better; ties go to the lower strength."""
        return (-self.sign * t.metrics[self.objective.score], t.strength)

    def dev(self) -> list[Trial]:
        return [t for t in self.trials if t.split == DEV]

    # -- the phases ---------------------------------------------------------------------------------
    def coarse(self, grid: list[Calibration]) -> list[Trial]:
        coarse = [t for t in (self.trial(c, DEV, "coarse") for c in grid) if t is not None]
        if self.skipped:
            labels = ", ".join(t.label for t in self.skipped)
            self.say(
                f"skipped {len(self.skipped)} of {len(grid)} grid points: {NOOP_LABEL} on the dev split ({labels})"
            )
        return coarse

    def lines(self, coarse: list[Trial]) -> list[Calibration]:
        """The fine search's line of each variant: its best coarse setting (feasible if any) at strength 0."""
        out = []
        for v in self.space.variants:
            of_v = [t for t in coarse if t.variant == v]
            if of_v:
                out.append(min([t for t in of_v if self.feasible(t)] or of_v, key=self.rank).line)
        return out

    def fine(self, line: Calibration) -> None:
        """Bisect the strength along ``line`` around the best feasible point, ``fine_rounds`` times."""
        for _ in range(self.space.fine_rounds):
            on_line = [self.stock] + [t for t in self.dev() if t.line == line]
            best = min([t for t in on_line if self.feasible(t)], key=self.rank)
            strengths = sorted({t.strength for t in on_line})
            i = strengths.index(best.strength)
            mids = [(strengths[j] + best.strength) / 2 for j in (i - 1, i + 1) if 0 <= j < len(strengths)]
            new = [m for m in mids if abs(m - best.strength) >= self.space.min_step / 2]
            if not new:
                return
            self.bar.total += len(new)
            self.bar.refresh()
            for m in new:
                self.trial(replace(line, strength=round_strength(m)), DEV, "fine")  # same line: never a no-op

    def choose(self) -> tuple[Trial, bool, list[Trial], dict[str, list[Trial]], dict[str, Calibration | None]]:
        """The pick (best feasible dev trial), whether any calibration is feasible, the front, each variant's
        front and best feasible setting."""
        o, dev = self.objective, self.dev()
        pick = min([t for t in dev if self.feasible(t)], key=self.rank)
        any_feasible = any(self.feasible(t) for t in dev if not t.stock)
        front = pareto_front(dev, o.score, o.guard, o.greater_is_better)
        fronts, variant_best = {}, {}
        for v in self.space.variants:
            of_v = [t for t in dev if t.variant == v]
            fronts[v] = pareto_front([self.stock, *of_v], o.score, o.guard, o.greater_is_better)
            ok = [t for t in of_v if self.feasible(t)]
            variant_best[v] = min(ok, key=self.rank).calibration if ok else None
        if all(t.stock for t in dev):
            self.say(f"chosen: {pick.label} (every grid point was a no-op: nothing calibrated)")
        else:
            self.say(f"chosen: {pick.label}" + ("" if any_feasible else " (no calibration satisfies the constraint)"))
        return pick, any_feasible, front, fronts, variant_best

    def confirm_on_test(self, pick: Trial, variant_best: dict[str, Calibration | None]) -> None:
        """Only now does the test split enter: stock, the choice, and each variant's best feasible dev setting."""
        self.trial(STOCK, TEST, "test")
        if not pick.stock:
            self.trial(pick.calibration, TEST, "test")
        if len(self.space.variants) > 1:
            extra = [c for c in variant_best.values() if c is not None and c != pick.calibration]
            self.bar.total += len(extra)
            for c in extra:
                self.trial(c, TEST, "test")


def run_search(
    objective: Objective,
    space: SearchSpace | None = None,
    *,
    max_drop: float = 0.02,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    show_progress_bar: bool | None = None,
) -> TuneResult:
    """Search ``space`` on the dev split, choose under the constraint, then evaluate stock and the choice on test.

    ``max_drop``: the most the guard metric may fall below stock on dev (in its own units:
    0.02 = 2 points of recall or nDCG@10).  ``results_path``: ``tune.json``, rewritten
    atomically after every trial and read back on a re-run (finished trials are not redone).
    ``log``: called with each line the search logs (INFO on this module's logger), e.g. to
    print them.  ``show_progress_bar``: a tqdm bar over the trials (None: shown when this
    module's logger is at INFO or DEBUG).
    """
    space = space or SearchSpace()
    if any("prior" in v.split("+") for v in space.variants) and space.prior is None:
        estimate = getattr(objective, "estimate_prior", None)
        if estimate is None:
            raise PosfairInputError(
                f"objective {objective.name!r} cannot estimate a positional prior: give SearchSpace(prior=...)"
            )
        space = replace(space, prior=estimate())
    if max_drop < 0:
        raise PosfairInputError(f"max_drop must be >= 0; got {max_drop}")
    t0 = time.perf_counter()
    path = Path(results_path) if results_path is not None else None
    grid = space.coarse()
    # stock + the grid + stock and the choice on test; each fine point adds one as it comes
    search = _Search(objective, space, max_drop, path, log, show_progress_bar, total=len(grid) + 3)
    try:
        search.stock = search.trial(STOCK, DEV, "stock")
        coarse = search.coarse(grid)
        for line in search.lines(coarse):
            search.fine(line)
        pick, any_feasible, front, fronts, variant_best = search.choose()
        search.confirm_on_test(pick, variant_best)
        result = TuneResult(
            search.desc,
            space.to_dict(),
            max_drop,
            search.trials,
            pick.calibration,
            front,
            any_feasible,
            time.perf_counter() - t0,
            list(search.skipped),
            fronts,
            variant_best,
            effect=objective.effect,
        )
        result.intervals = trial_intervals(objective, result.trials)
        result.test_check = check_test_constraint(objective, result.trials, result.chosen, result.guard, max_drop)
        result.test_effect = test_score_effect(objective, result.trials, result.chosen, result.score)
        if result.test_effect is not None:
            search.say(result.test_effect.verdict)
        if result.test_check is not None:
            search.say(result.test_check.verdict)
            if not result.test_check.holds:
                warnings.warn(
                    f"{result.chosen_label}: {result.test_check.verdict}",
                    ConstraintWarning,
                    stacklevel=user_stacklevel(),
                )
        search.save(result.to_dict())
        search.bar.total = search.bar.n  # the choice may be stock: evaluated on test once
    finally:
        search.bar.close()
    return result
