"""Progress of long library calls, as sentence-transformers reports it: tqdm bars or a caller's callback.

A library call never draws with typer or rich: it takes a callback (the CLI drives
its own bars through it) and, without one, shows a :mod:`tqdm.auto` bar (a widget
in a notebook, text in a terminal) when ``show_progress_bar`` is True, or when it
is None and the call's logger is at INFO or DEBUG -- the rule of
sentence-transformers' ``encode``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tqdm.auto import tqdm

__all__ = ["resolve_show_progress_bar", "TqdmTasks"]


def resolve_show_progress_bar(show_progress_bar: bool | None, logger: logging.Logger) -> bool:
    """``show_progress_bar``, or for None whether ``logger`` is at INFO or DEBUG."""
    if show_progress_bar is None:
        return logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
    return bool(show_progress_bar)


class TqdmTasks:
    """A ``progress(description, total, done) -> tick(k)`` callback drawing one tqdm bar per task.

    The shape of :func:`posfair.fairness.experiment.run_instances`' ``progress``: each task
    (an instance and variant) gets its bar, closed when it is full or when the next task
    starts; :meth:`close` (or leaving the ``with`` block) closes the last one.
    """

    def __init__(self, unit: str = "text") -> None:
        self.unit = unit
        self._bar: tqdm | None = None

    def __call__(self, description: str, total: int, done: int = 0) -> Callable[[int], None]:
        self.close()
        bar = self._bar = tqdm(total=total, initial=done, desc=description, unit=self.unit)

        def tick(k: int) -> None:
            bar.update(k)
            if bar.n >= bar.total:
                bar.close()

        return tick

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> TqdmTasks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
