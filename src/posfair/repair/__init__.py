"""Repairing a model's positional bias on documents it was not fitted on (``posfair fit``).

:func:`fit_repair` fits one method on some document families of a corpus, judges it on a held-out family against
stock (:mod:`.heldout`: bias removed per position with intervals, reversal, own-segment retrieval, nDCG@10) and
saves the repaired model only when it holds.  Modules: :mod:`.data` (the family split), :mod:`.heldout` (the
held-out measures and the one rule that says whether a repair holds), :mod:`.finetune` (position-balanced
fine-tuning), :mod:`.learned` (per-head strengths by gradient; TempScale), :mod:`.grid` (the papers' grid),
:mod:`.family_benchmark` (nDCG@10 on the held-out family), `.fitting` (the command's pipeline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.repair.data import RepairSplit, repair_split  # noqa: F401
    from posfair.repair.finetune import FinetuneSettings, OrderInvariantLoss  # noqa: F401
    from posfair.repair.fitting import DEFAULT_METHOD, METHODS, FitResult, fit_repair  # noqa: F401
    from posfair.repair.heldout import HeldOut, RepairLimits, check_repair  # noqa: F401

_EXPORTS = {
    "RepairSplit": ".data",
    "repair_split": ".data",
    "FinetuneSettings": ".finetune",
    "OrderInvariantLoss": ".finetune",
    "DEFAULT_METHOD": ".fitting",
    "METHODS": ".fitting",
    "FitResult": ".fitting",
    "fit_repair": ".fitting",
    "HeldOut": ".heldout",
    "RepairLimits": ".heldout",
    "check_repair": ".heldout",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.repair", _EXPORTS)
