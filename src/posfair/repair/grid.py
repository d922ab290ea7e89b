"""The baseline every other repair must beat: the papers' grid as ``posfair tune`` searches it.

:func:`grid_choice` runs :func:`posfair.tuning.tune` (fairness objective: flatten the σ profile, keep own-segment
recall) on the fit families only, with its own dev / test split of their topics, and returns the setting it
chooses (``posfair.STOCK`` when nothing is feasible).  The held-out family takes no part.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from posfair.tuning import default_fairness_settings, tune

__all__ = ["grid_choice"]


def grid_choice(model, fit_corpus: pd.DataFrame, work: Path, *, limit: int, max_drop: float = 0.01):
    """The grid's chosen calibration on ``fit_corpus`` (documents of at most ``limit`` tokens; ``max_drop``: the
    recall the constraint allows, as a share)."""
    settings = default_fairness_settings(max_seq_length=limit)
    result = tune(model, fit_corpus, settings=settings, max_drop=max_drop, out_dir=work, show_progress_bar=False)
    return result.chosen
