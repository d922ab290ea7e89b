"""The values a calibration setting takes: the types and allowed values of its fields (the special-token share,
the poolings, the trailing-basket policies, the strength schedules, the variant names) and :data:`POOLING_DECIDES`,
the value of a field left to the model's pooling.  Every other settings module imports these
(:mod:`posfair.calibration.params`, :mod:`~posfair.calibration.spelling`, :mod:`~posfair.calibration.resolved`);
this one imports none of them.
"""

from __future__ import annotations

import enum
from typing import Final, Literal

Share = Literal["equal", "original"] | float
#: the parts a variant is made of, in the order a combination names them
VARIANT_PARTS: tuple[str, ...] = ("prior", "self", "special")
#: the variant names (what ``Calibration.variant`` reports and the tuner searches): the papers' formula, each
#: part alone and every combination of parts, named by its parts joined with "+" in VARIANT_PARTS' order
VARIANTS: tuple[str, ...] = (
    "uniform",
    "prior",
    "self",
    "special",
    "prior+self",
    "prior+special",
    "self+special",
    "prior+self+special",
)
Pooling = Literal["cls", "mean", "lasttoken"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "lasttoken")
Trailing = Literal["basket", "merge", "weighted"]
#: the trailing-basket policies (``Calibration.trailing``); the first is the papers' and the default
TRAILING: tuple[str, ...] = ("basket", "merge", "weighted")
Schedule = Literal["flat", "rising", "falling"]
#: the per-layer strength schedules (``Calibration.schedule``); the first is the papers' and the default
SCHEDULES: tuple[str, ...] = ("flat", "rising", "falling")


class PoolingDecides(enum.Enum):
    """The type of :data:`POOLING_DECIDES` (an enum, so it survives copying between processes as itself)."""

    POOLING_DECIDES = "pooling decides"

    def __repr__(self) -> str:
        return "POOLING_DECIDES"

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of POOLING_DECIDES is not defined: resolve the calibration for a pooling first"
        )


#: the value of ``isolate_bos`` / ``isolate_eos`` / ``queries`` left to the model's pooling (``None`` is accepted
#: for it); :meth:`Calibration.resolve` replaces it (CLS pooling isolates BOS, last-token pooling BOS and EOS,
#: mean pooling nothing; "all" query rows for mean pooling, the pooling row otherwise)
POOLING_DECIDES: Final = PoolingDecides.POOLING_DECIDES
