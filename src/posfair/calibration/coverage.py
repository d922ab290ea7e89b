"""Which texts a calibration actually changes: the one rule every count in posfair uses.

The rule itself is :mod:`posfair.calibration.rule`, which the engine's kernels call too.
The engine (:func:`posfair.calibration.baskets.calibrate_rows` /
``calibrate_span_``) works on a text's *valid span*: its ``n_tokens`` tokens
after truncation, special tokens and prompt included (the attention mask's
ones).  The first / last valid key is taken out of the baskets when
``isolate_bos`` / ``isolate_eos`` is set, which leaves
``C = n_tokens - isolate_bos - isolate_eos`` content keys.  A text's attention
rows are calibrated when ``C >= basket_size``; otherwise they are returned
unchanged (the authors' rule).

Two further cases leave every row unchanged although the engine runs:

* one basket (``C == basket_size``; with ``trailing="merge"`` any
  ``basket_size <= C < 2 * basket_size``) with no isolated key given a new share
  (isolated keys all ``"original"``, or none isolated) and no self-attention share
  below 1: one basket holds all the content mass, so rescaling it to its target
  mass multiplies by 1 (up to float rounding);
* ``strength == 0``: the blend returns the original row.

:func:`fallback_reasons` classifies token counts into those cases;
:func:`calibrated_mask` and :func:`calibration_coverage` are built on it, so
the encode-time warning, the ``calibrated_share`` columns of every table and the
tuner's skipping of no-op grid points can never disagree with each other or with
what the engine did.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from posfair.calibration.params import BasketSettings, Calibration, ResolvedCalibration
from posfair.calibration.rule import engine_calibrates, row_changes, strength_zero

__all__ = [
    "SHARE_NAME",
    "CalibrationFallbackWarning",
    "CalibrationCoverage",
    "CALIBRATED",
    "SHORTER",
    "ONE_BASKET",
    "STRENGTH_ZERO",
    "NOOP_LABEL",
    "fallback_reasons",
    "calibrated_mask",
    "calibration_coverage",
    "quiet_fallback",
    "fallback_warnings_enabled",
    "format_share",
    "text_settings",
]

CALIBRATED, SHORTER, ONE_BASKET, STRENGTH_ZERO = 0, 1, 2, 3
#: how a calibration that changes no text is marked in tables, figures and logs
NOOP_LABEL = "no-op: nothing calibrated"
#: the fraction of documents a calibration changed, as every table, legend and report a person reads names it (the
#: data's field is ``calibrated_share``: CSV of observations, JSON records, metric names)
SHARE_NAME = "calibrated share"

AnyCalibration = Calibration | ResolvedCalibration


class CalibrationFallbackWarning(UserWarning):
    """Some texts of an ``encode`` call were encoded stock although a calibration was given."""


def _concrete(calibration: AnyCalibration, pooling: str | None) -> AnyCalibration:
    """``calibration`` with the keys it isolates decided (a Calibration by ``pooling``)."""
    if isinstance(calibration, ResolvedCalibration):
        return calibration
    if isinstance(calibration, Calibration):
        if pooling is None:
            raise ValueError(
                "a Calibration needs the model's pooling to tell which keys it isolates (or pass a ResolvedCalibration)"
            )
        return calibration.pooled(pooling)
    raise TypeError(f"calibration must be a Calibration or ResolvedCalibration; got {type(calibration).__name__}")


def text_settings(calibration: AnyCalibration, pooling: str | None = None) -> BasketSettings:
    """The one :class:`BasketSettings` that :func:`posfair.calibration.rule.row_changes` reads for a whole
    calibration: its fields as every calibrated layer has them (the keys isolated decided by ``pooling`` for a
    :class:`Calibration`), and as ``strength`` the largest strength of any layer or head -- 0 only when every
    layer returns its rows as they were (a strength schedule scales the strength, never to 0 from a non-zero one;
    the positional prior never decides whether a row changes)."""
    cal = _concrete(calibration, pooling)
    heads = [float(v) for _, layer in cal.head_strengths or () for v in layer]
    return BasketSettings(
        basket_size=int(cal.basket_size),
        strength=max([float(cal.strength), *heads]),
        isolate_bos=cal.isolate_bos,
        isolate_eos=cal.isolate_eos,
        bos_weight=cal.bos_weight,
        eos_weight=cal.eos_weight,
        self_share=cal.self_share,
        trailing=cal.trailing,
        temperature=cal.temperature,
    )


def fallback_reasons(calibration: AnyCalibration, n_tokens, pooling: str | None = None) -> np.ndarray:
    """Per text: :data:`CALIBRATED`, :data:`SHORTER` (content shorter than one basket: the engine
    skips it), :data:`ONE_BASKET` (content of exactly one basket that the formula leaves as it is:
    see :mod:`posfair.calibration.rule`) or :data:`STRENGTH_ZERO`.

    ``n_tokens``: the valid-span length of each text as the model sees it (after truncation to
    ``max_seq_length``, with special tokens and any prompt).  ``pooling`` is needed only for an
    unresolved :class:`~posfair.Calibration` (it decides which keys are isolated).
    """
    cal = text_settings(calibration, pooling)
    C = np.asarray(n_tokens, dtype=np.int64) - int(cal.isolate_bos) - int(cal.isolate_eos)  # content keys
    out = np.full(C.shape, ONE_BASKET, dtype=np.int8)
    out[row_changes(C, cal)] = CALIBRATED
    out[~engine_calibrates(C, cal.basket_size)] = SHORTER
    if strength_zero(cal):
        out[...] = STRENGTH_ZERO
    return out


def calibrated_mask(calibration: AnyCalibration, n_tokens, pooling: str | None = None) -> np.ndarray:
    """Bool per text: does ``calibration`` change its embedding (see :func:`fallback_reasons`)."""
    return fallback_reasons(calibration, n_tokens, pooling) == CALIBRATED


@dataclass(frozen=True)
class CalibrationCoverage:
    """How many of ``total`` texts a calibration changed, and why the others were encoded stock."""

    basket_size: int
    total: int
    calibrated: int
    shorter: int
    one_basket: int
    strength_zero: int
    trailing: str = "basket"  # the calibration's trailing-basket policy (what "one basket" means)

    @property
    def fallen_back(self) -> int:
        return self.total - self.calibrated

    @property
    def share(self) -> float:
        """Fraction of the texts actually calibrated (NaN for no texts)."""
        return self.calibrated / self.total if self.total else math.nan

    @property
    def noop(self) -> bool:
        """True when texts were given and none was calibrated."""
        return self.total > 0 and self.calibrated == 0

    def message(self) -> str | None:
        """The warning text, or None when every text was calibrated."""
        if not self.fallen_back:
            return None
        n, k, B = self.total, self.fallen_back, self.basket_size
        if self.strength_zero:
            return f"calibration strength is 0: all {n} texts were encoded stock"
        share = f" (calibrated share {self.share:.3f})"
        if not self.one_basket:
            return f"{k} of {n} texts are shorter than one basket (B={B} content tokens) and were encoded stock{share}"
        parts = []
        if self.shorter:
            parts.append(f"{self.shorter} {'is' if self.shorter == 1 else 'are'} shorter than one basket")
        if self.trailing == "merge":
            one = f"{'fills' if self.one_basket == 1 else 'fill'} one basket (a short last basket merged into it)"
        else:
            one = f"{'fills' if self.one_basket == 1 else 'fill'} exactly one basket"
        parts.append(f"{self.one_basket} {one}, which calibration leaves unchanged")
        return f"{k} of {n} texts were encoded stock (B={B} content tokens): " + " and ".join(parts) + share

    def to_dict(self) -> dict[str, float]:
        return {
            "total": self.total,
            "calibrated": self.calibrated,
            "shorter": self.shorter,
            "one_basket": self.one_basket,
            "strength_zero": self.strength_zero,
            "calibrated_share": self.share,
        }


def calibration_coverage(calibration: AnyCalibration, n_tokens, pooling: str | None = None) -> CalibrationCoverage:
    """Counts of :func:`fallback_reasons` over texts with valid spans of ``n_tokens`` tokens."""
    r = fallback_reasons(calibration, n_tokens, pooling).ravel()
    return CalibrationCoverage(
        trailing=calibration.trailing,
        basket_size=int(calibration.basket_size),
        total=int(r.size),
        calibrated=int((r == CALIBRATED).sum()),
        shorter=int((r == SHORTER).sum()),
        one_basket=int((r == ONE_BASKET).sum()),
        strength_zero=int((r == STRENGTH_ZERO).sum()),
    )


def format_share(share: float | None, digits: int = 3) -> str:
    """A calibrated share for a table cell: ``"—"`` for stock / not applicable (NaN or None)."""
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return "—"
    return f"{float(share):.{digits}f}"


_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("posfair_quiet_fallback", default=False)


def fallback_warnings_enabled() -> bool:
    """False inside :func:`quiet_fallback` (encode then neither counts nor warns)."""
    return not _QUIET.get()


@contextlib.contextmanager
def quiet_fallback() -> Iterator[None]:
    """Silence ``encode``'s per-call :class:`CalibrationFallbackWarning` (for pipelines that report
    the calibrated share once per configuration themselves)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)
