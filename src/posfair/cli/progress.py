"""The one progress display of every command: rich bars on stderr (results go to stdout)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["progress_bars", "console", "Tick"]

#: ``tick(k)``: k more items done
Tick = Callable[[int], None]


@contextlib.contextmanager
def progress_bars(*, complete_on_exit: bool = False) -> Iterator[Callable[..., Tick]]:
    """Yield ``bar(description, total, done=0) -> tick``; each call adds a bar with counts, elapsed and remaining time.

    The library reports progress through such callbacks (``progress=`` of
    ``audit``, ``encode_cached``, ``embed_texts``, ``attention_profile``...);
    ``complete_on_exit`` fills every bar when the block ends without an error
    (a bar whose items were partly answered from the cache).
    """
    from rich.console import Console  # rich is imported only when a command runs
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # the display starts with its first bar: a command that fails before any work prints nothing but its error line
    started: list[Progress] = []
    with contextlib.ExitStack() as stack:

        def bar(description: str, total: int, done: int = 0) -> Tick:
            if not started:
                started.append(stack.enter_context(Progress(*columns, console=Console(stderr=True))))
            prog = started[0]
            task = prog.add_task(escape(description), total=total, completed=done)
            return lambda k: prog.advance(task, k)

        yield bar
        if complete_on_exit and started:
            for task in started[0].tasks:
                started[0].update(task.id, completed=task.total)


def console():
    """The rich console results are printed on (stdout): on a terminal with its width and styles; piped or
    redirected as plain text, lines never wrapped (a log or ``grep`` sees whole lines, no escape codes)."""
    from rich.console import Console

    con = Console()
    return con if con.is_terminal else Console(soft_wrap=True, no_color=True, highlight=False, emoji=False)
