"""A repair judged on documents it was not fitted on: the held-out table and its checks.

The units are segment sets of the held-out family: every ordering of each set is a document, so each set
contributes the same segments at every position and what the sets share cancels in a paired comparison.
Per set and model (stock, repaired) :func:`set_units` keeps

* the mean σ at each position (σ = cosine of the standalone segment and the document), whose
  differences to position 1 are the OLS position coefficients β_p of a balanced permutation design;
* own-segment recall@1: the share of the set's documents whose nearest segment (among the standalone
  segments of every held-out set) is one of their own;
* the share of (document, own segment) pairs whose own segment is nearer to the document than every
  foreign segment, overall and per position ("every part of a document stays findable").

:func:`evaluate_repair` turns them into :class:`HeldOut`: the share of stock's |β_p| removed with a paired
bootstrap interval over sets (:func:`posfair.stats.intervals.grouped_interval`), whether a β_p is reversed
beyond noise (its interval wholly on the other side of zero), and the retrieval changes in points with their
intervals.  :func:`check_repair` is the one rule that says whether a repair holds; ``posfair fit`` uses it
to decide whether to save, and every table prints its verdict.  :func:`effect_words` says what happened to each
β_p from the same values: a β_p whose sign flipped is *reversed* (with what is left of |β_p|, the other way),
never a share "removed".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np

from posfair.fairness.documents import Instance
from posfair.stats.intervals import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, grouped_interval, paired_mean_interval

__all__ = [
    "Encode",
    "HeldOut",
    "PositionEffect",
    "RetrievalChange",
    "RepairLimits",
    "check_repair",
    "effect_words",
    "measure_change",
    "heldout_lines",
    "evaluate_repair",
    "set_units",
]

#: texts -> unit-length embeddings (n x dim), one model's encoder
Encode = Callable[[Sequence[str]], np.ndarray]

#: how a repaired β_p leans against stock's, judged on its interval
Lean = Literal["as stock", "flat", "reversed"]


@dataclass(frozen=True)
class RepairLimits:
    """What a repair must do on the held-out family to hold.

    ``min_removed``: the share of stock's |β_p| removed at every later position (point estimate);
    ``max_recall_drop``: points of own-segment recall@1 and of the own-segment-above-every-foreign share the
    repair may lose (point estimate); a β_p reversed beyond noise always fails."""

    min_removed: float = 0.9
    max_recall_drop: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_removed <= 1.0:
            raise ValueError(f"min_removed must be in [0, 1]; got {self.min_removed}")
        if not self.max_recall_drop >= 0.0:
            raise ValueError(f"max_recall_drop must be >= 0 points; got {self.max_recall_drop}")


@dataclass(frozen=True)
class PositionEffect:
    """Position ``p``: stock's and the repair's β_p (σ at p minus σ at 1), each with its 95 % interval, and
    ``removed`` = 1 - |repaired| / |stock| with its interval (of magnitudes: a sign flip is read from
    :attr:`flipped`, and reported by :func:`effect_words`); ``lean``: the repaired β_p's interval against stock's
    sign."""

    position: int
    stock: float
    stock_low: float
    stock_high: float
    repaired: float
    repaired_low: float
    repaired_high: float
    removed: float
    removed_low: float
    removed_high: float
    lean: Lean

    @property
    def flipped(self) -> bool:
        """Whether the repaired β_p (point estimate) has the sign opposite to stock's: bias the other way, which a
        share "removed" would misstate as progress (stock -0.09 -> +0.03 is "66 % removed")."""
        return bool(self.stock * self.repaired < 0)

    @classmethod
    def from_dict(cls, d: dict) -> PositionEffect:
        """The effect :meth:`HeldOut.to_dict` wrote (its derived keys ``sign_flipped`` and ``outcome`` dropped)."""
        return cls(**{k: v for k, v in d.items() if k not in ("sign_flipped", "outcome")})


@dataclass(frozen=True)
class RetrievalChange:
    """One retrieval measure under stock and the repair (shares in [0, 1]) and the change in points with its
    95 % interval (paired over the measure's units: segment sets, or sections for the query measures of
    :mod:`posfair.repair.queries`)."""

    measure: str
    stock: float
    repaired: float
    change: float
    change_low: float
    change_high: float


@dataclass(frozen=True)
class HeldOut:
    """The repair on the held-out family: β per later position, retrieval changes, the sets measured."""

    family: str
    sets: int
    documents: int
    positions: tuple[PositionEffect, ...]
    retrieval: tuple[RetrievalChange, ...]
    above_by_position: tuple[tuple[float, float], ...] = field(default=())  # (stock, repaired) per position

    def retrieval_change(self, measure: str) -> RetrievalChange:
        for r in self.retrieval:
            if r.measure == measure:
                return r
        raise KeyError(measure)

    def to_dict(self) -> dict:
        """Plain values; each position also carries ``sign_flipped`` and ``outcome`` (:func:`effect_words`)."""
        d = asdict(self)
        for e, row in zip(self.positions, d["positions"], strict=True):
            row["sign_flipped"] = e.flipped
            row["outcome"] = effect_words(e)
        return d


def set_units(instance: Instance, encode: Encode) -> np.ndarray:
    """Per segment set of ``instance`` one row (sets x (2n + 1)): the mean σ at positions 1..n, the share of the
    set's (document, own segment) pairs at positions 1..n whose own segment is nearer than every foreign segment,
    and the set's own-segment recall@1.  Segments are embedded standalone once each; foreign segments are the
    standalone segments of every other set of the instance."""
    docs = instance.documents
    n = instance.n
    text_of: dict[str, str] = {}
    for d in docs:
        text_of.update(zip(d.segment_ids, d.texts, strict=True))
    seg_ids = sorted(text_of)
    index = {s: i for i, s in enumerate(seg_ids)}
    S = encode([text_of[s] for s in seg_ids])
    D = encode([d.text for d in docs])
    sims = D.astype(np.float64) @ S.astype(np.float64).T
    own = np.array([[index[s] for s in d.segment_ids] for d in docs], dtype=np.int64)
    sigma = np.take_along_axis(sims, own, axis=1)
    set_members: dict[str, set[int]] = {}
    for d, o in zip(docs, own, strict=True):
        set_members.setdefault(d.set_id, set()).update(o.tolist())
    foreign = np.ones_like(sims, dtype=bool)
    for i, d in enumerate(docs):
        foreign[i, sorted(set_members[d.set_id])] = False
    best_foreign = np.where(foreign, sims, -np.inf).max(axis=1)
    above = sigma > best_foreign[:, None]
    top1 = (own == sims.argmax(axis=1)[:, None]).any(axis=1)
    set_ids = [s.set_id for s in instance.sets]
    rows = []
    doc_set = np.array([d.set_id for d in docs])
    for sid in set_ids:
        m = doc_set == sid
        rows.append(np.concatenate([sigma[m].mean(axis=0), above[m].mean(axis=0), [top1[m].mean()]]))
    return np.array(rows, dtype=np.float64).reshape(len(set_ids), 2 * n + 1)


def _betas(sigma: np.ndarray) -> np.ndarray:
    """β_p for p = 2..n from sets' position means (sets x n)."""
    means = sigma.mean(axis=0)
    return means[1:] - means[0]


def evaluate_repair(
    stock: np.ndarray,
    repaired: np.ndarray,
    n: int,
    family: str = "",
    documents: int = 0,
    *,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
) -> HeldOut:
    """Stock against the repair on the same sets (:func:`set_units` rows of each, in the same order)."""
    stock, repaired = np.asarray(stock, np.float64), np.asarray(repaired, np.float64)
    if stock.shape != repaired.shape or stock.shape[1] != 2 * n + 1:
        raise ValueError(
            f"stock and repaired units must both be (sets, {2 * n + 1}); got {stock.shape}, {repaired.shape}"
        )
    if len(stock) < 2:
        raise ValueError(f"the held-out family has {len(stock)} segment set(s); intervals need at least 2")
    paired = np.stack([stock, repaired], axis=1)  # sets x 2 x (2n + 1)
    positions = []
    for p in range(2, n + 1):
        col = p - 1

        def beta(groups, which, col=col):
            return float(_betas(groups[0][:, which, :n])[col - 1])

        def removed(groups, col=col):
            s, r = (float(_betas(groups[0][:, k, :n])[col - 1]) for k in (0, 1))
            return 1.0 - abs(r) / abs(s) if s else float("nan")

        b_s, b_r = beta([paired], 0), beta([paired], 1)
        s_lo, s_hi = grouped_interval([paired], lambda g: beta(g, 0), draws=draws, seed=seed)
        r_lo, r_hi = grouped_interval([paired], lambda g: beta(g, 1), draws=draws, seed=seed)
        rm_lo, rm_hi = grouped_interval([paired], removed, draws=draws, seed=seed)
        positions.append(
            PositionEffect(p, b_s, s_lo, s_hi, b_r, r_lo, r_hi, removed([paired]), rm_lo, rm_hi, _lean(b_s, r_lo, r_hi))
        )
    retrieval = [
        measure_change("recall@1", stock[:, 2 * n], repaired[:, 2 * n], draws=draws, seed=seed),
        measure_change(
            "own above every foreign",
            stock[:, n : 2 * n].mean(axis=1),
            repaired[:, n : 2 * n].mean(axis=1),
            draws=draws,
            seed=seed,
        ),
    ]
    above = tuple((float(stock[:, n + k].mean()), float(repaired[:, n + k].mean())) for k in range(n))
    return HeldOut(family, len(stock), documents, tuple(positions), tuple(retrieval), above)


def _lean(stock_beta: float, low: float, high: float) -> Lean:
    """The repaired β_p's interval against stock's sign: wholly on the other side of zero is ``reversed``."""
    if stock_beta == 0 or not np.isfinite(stock_beta):
        return "flat" if low <= 0 <= high else "as stock"
    if np.sign(stock_beta) > 0:
        return "reversed" if high < 0 else ("as stock" if low > 0 else "flat")
    return "reversed" if low > 0 else ("as stock" if high < 0 else "flat")


def measure_change(
    measure: str,
    stock: np.ndarray,
    repaired: np.ndarray,
    *,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
) -> RetrievalChange:
    """``measure`` from per-unit shares of stock and the repair (the same units, in the same order): the means and
    the change in points with its paired bootstrap interval."""
    stock, repaired = np.asarray(stock, np.float64), np.asarray(repaired, np.float64)
    diff = 100.0 * (repaired - stock)
    low, high = paired_mean_interval(diff, draws=draws, seed=seed)
    return RetrievalChange(measure, float(stock.mean()), float(repaired.mean()), float(diff.mean()), low, high)


def effect_words(e: PositionEffect) -> str:
    """What the repair did to stock's β_p, as every report writes it (the summary, ``heldout.md``, ``heldout.json``,
    the figure), from the values :func:`check_repair` decides on (``removed``, the signs, ``lean``).

    While the repaired β_p keeps stock's sign (or is 0): ``stock -0.0895 -> -0.0071, removed 95 % [90, 99] (as
    stock)``.  When the sign flipped the bias was not removed but turned the other way, so the words say so, with
    the repaired β_p's interval and what is left, 1 - ``removed``: ``reversed: stock -0.0895 -> +0.0306 [+0.0229,
    +0.0383]; |β2| now 34 % of stock's, the other way (beyond noise)`` ("within noise" while that interval holds
    0)."""
    if not e.flipped:
        return (
            f"stock {e.stock:+.4f} -> {e.repaired:+.4f}, removed {100 * e.removed:.0f} % "
            f"[{100 * e.removed_low:.0f}, {100 * e.removed_high:.0f}] ({e.lean})"
        )
    noise = {"reversed": "beyond noise", "flat": "within noise"}.get(e.lean, e.lean)
    return (
        f"reversed: stock {e.stock:+.4f} -> {e.repaired:+.4f} [{e.repaired_low:+.4f}, {e.repaired_high:+.4f}]; "
        f"{_left(e)}, the other way ({noise})"
    )


def _left(e: PositionEffect) -> str:
    """``|β_p| now K % of stock's``: K = 100 (1 - removed) = 100 |repaired| / |stock|."""
    return f"|β{e.position}| now {100 * (1 - e.removed):.0f} % of stock's"


def heldout_lines(result: HeldOut) -> list[str]:
    """The held-out result as plain lines: per later position β_p stock -> repaired in :func:`effect_words`, then
    each retrieval change in points with its interval (``posfair fit``'s summary and the benchmarks)."""
    lines = [f"β{e.position}: {effect_words(e)}" for e in result.positions]
    lines += [
        f"{c.measure}: {100 * c.stock:.1f} -> {100 * c.repaired:.1f} % "
        f"({c.change:+.1f} points [{c.change_low:+.1f}, {c.change_high:+.1f}])"
        for c in result.retrieval
    ]
    return lines


def check_repair(result: HeldOut, limits: RepairLimits) -> list[str]:
    """What the repair fails on the held-out family, one phrase each (empty: it holds).  The one rule that decides
    whether ``posfair fit`` saves a repair and what every table says of it.  A β_p whose sign flipped is named
    reversed, never "removed" (:func:`effect_words` reads the same values)."""
    failed = []
    for e in result.positions:
        beyond = e.lean == "reversed"
        noise = f" beyond noise ({e.repaired:+.4f} [{e.repaired_low:+.4f}, {e.repaired_high:+.4f}])" if beyond else ""
        too_much = not e.removed >= limits.min_removed
        if e.flipped and (too_much or beyond):
            limit = f"; at most {100 * (1 - limits.min_removed):.0f} % may remain" if too_much else ""
            failed.append(f"β{e.position} reversed{noise}: {_left(e)}, the other way{limit}")
            continue
        if too_much:
            failed.append(f"β{e.position}: {100 * e.removed:.0f} % removed, below {100 * limits.min_removed:.0f} %")
        if beyond:
            failed.append(f"β{e.position} reversed{noise}")
    for r in result.retrieval:
        if not r.change >= -limits.max_recall_drop:
            failed.append(f"{r.measure} {r.change:+.1f} points, beyond the -{limits.max_recall_drop:g}-point limit")
    return failed
