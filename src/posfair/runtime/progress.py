"""Progress of long library calls, reported as sentence-transformers does: tqdm bars, or a caller's callback.

``show_progress_bar=None`` shows tqdm bars in a notebook (an IPython kernel is running:
``audit()`` there shows progress instead of minutes of silence) and elsewhere when the
calling module's logger is at INFO or DEBUG (sentence-transformers' rule), so a script
that does not turn on logging prints nothing.  A caller that draws its own bars (the
command line's rich bar) passes ``progress`` instead: ``progress(description, total,
already_done)`` returns ``advance(n)`` (or None), the signature the fairness audit's
``run_instances`` takes too.  Library code never imports typer or rich.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

from tqdm.auto import tqdm

__all__ = ["ProgressCallback", "TqdmTasks", "progress_enabled", "progress_tasks"]

#: ``progress(description, total, already_done) -> advance(n) or None``
ProgressCallback = Callable[[str, int, int], Callable[[int], None] | None]


def _ignore(n: int) -> None:
    return None


def in_notebook() -> bool:
    """Whether this process is a Jupyter / IPython kernel (tqdm.auto draws widgets there)."""
    return "ipykernel" in sys.modules


def progress_enabled(show_progress_bar: bool | None, logger: logging.Logger) -> bool:
    """``show_progress_bar``; for None: in a notebook, or when ``logger`` is at INFO or DEBUG."""
    if show_progress_bar is None:
        return in_notebook() or logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
    return bool(show_progress_bar)


@contextlib.contextmanager
def progress_tasks(
    show_progress_bar: bool | None, logger: logging.Logger, progress: ProgressCallback | None = None
) -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """Yields ``task(description, total) -> advance(n)``.

    With ``progress``, each task is the caller's; else a tqdm bar per task when
    :func:`progress_enabled` (closed when the block ends, also on error); else nothing.
    """
    if progress is not None:

        def callback_task(desc: str, total: int) -> Callable[[int], None]:
            return progress(desc, total, 0) or _ignore

        yield callback_task
        return
    if not progress_enabled(show_progress_bar, logger):
        yield lambda desc, total: _ignore
        return
    bars: list[tqdm] = []

    def bar_task(desc: str, total: int) -> Callable[[int], None]:
        bar = tqdm(total=total, desc=desc, unit="text")
        bars.append(bar)

        def advance(n: int) -> None:
            bar.update(n)
            if bar.n >= total:  # done: free the line for the next task's bar
                bar.close()

        return advance

    try:
        yield bar_task
    finally:
        for bar in bars:
            bar.close()


class TqdmTasks:
    """A ``progress(description, total, done) -> tick(k)`` callback drawing one tqdm bar per task.

    The shape of :data:`ProgressCallback`: each task
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
