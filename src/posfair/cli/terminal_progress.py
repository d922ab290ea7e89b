"""The one progress display of every command: rich bars on stderr (results go to stdout), their labels cut at a
word to a short column, their ends kept (:func:`posfair.cli.terminal.short_label`); piped, one line per bar through :func:`posfair.cli.terminal.say`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from posfair.cli.terminal import Writer, say, short_label, width

__all__ = ["progress_bars", "console", "Tick"]

#: ``tick(k, note=None)``: k more items done; ``note`` (optional) is shown after the bar's label, e.g. the
#: objective of a fit's latest step
Tick = Callable[..., None]


@contextlib.contextmanager
def progress_bars(*, complete_on_exit: bool = False) -> Iterator[Callable[..., Tick]]:
    """Yield ``bar(description, total, done=0) -> tick``; each call adds a bar with counts, elapsed and remaining time.

    The library reports progress through such callbacks (``progress=`` of
    ``audit``, ``encode_cached``, ``embed_texts``, ``attention_profile``...);
    ``complete_on_exit`` fills every bar when the block ends without an error
    (a bar whose items were partly answered from the cache).  On a terminal the bars are
    rich's; when stderr is a file or a pipe, each bar is one plain line written when it
    completes (or when the block ends), wrapped at words as every line: no box drawing, nothing cut.
    """
    from rich.console import Console  # rich is imported only when a command runs

    if not Console(stderr=True).is_terminal:
        with _plain_lines(complete_on_exit) as bar:
            yield bar
        return
    from rich.markup import escape
    from rich.progress import Progress

    console = Console(stderr=True, width=width(sys.stderr))  # COLUMNS, else the terminal's
    label, columns = label_width(console.width), progress_columns(console.width)
    # the display starts with its first bar: a command that fails before any work prints nothing but its error line
    started: list[Progress] = []
    with contextlib.ExitStack() as stack:

        def bar(description: str, total: int, done: int = 0) -> Tick:
            if not started:
                started.append(stack.enter_context(Progress(*columns, console=console)))
            prog = started[0]
            task = prog.add_task(escape(short_label(description, label)), total=total, completed=done)

            def tick(k: int, note: str | None = None) -> None:
                if note:
                    prog.update(task, description=escape(short_label(f"{description} {note}", label)))
                prog.advance(task, k)

            return tick

        yield bar
        if complete_on_exit and started:
            for task in started[0].tasks:
                started[0].update(task.id, completed=task.total)


@contextlib.contextmanager
def _plain_lines(complete_on_exit: bool) -> Iterator[Callable[..., Tick]]:
    """Progress for a log: ``DESCRIPTION: DONE/TOTAL in 12.3 s`` on stderr, once per bar, when it completes;
    a bar left short when the block ends is written then, as far as it got (or filled: ``complete_on_exit``)."""
    import time

    open_bars: list[dict] = []

    def write(state: dict) -> None:
        if state["written"]:
            return
        state["written"] = True
        elapsed = time.perf_counter() - state["t0"]
        note = f", {state['note']}" if state.get("note") else ""
        say(f"{state['description']}: {state['done']:,}/{state['total']:,} in {elapsed:.1f} s{note}", err=True)

    def bar(description: str, total: int, done: int = 0) -> Tick:
        state = {"description": description, "total": int(total), "done": int(done), "t0": time.perf_counter(),
                 "written": False}  # fmt: skip
        open_bars.append(state)
        if state["done"] >= state["total"] > 0:
            write(state)  # answered from the cache already

        def tick(k: int, note: str | None = None) -> None:
            if note:
                state["note"] = note
            state["done"] += int(k)
            if state["done"] >= state["total"]:
                write(state)

        return tick

    failed = True
    try:
        yield bar
        failed = False
    finally:
        for state in open_bars:
            if complete_on_exit and not failed:
                state["done"] = state["total"]
            if failed and not state["written"] and state["done"] == 0:
                continue  # a bar that never moved says nothing beside the error line
            write(state)


def console() -> Writer:
    """The writer results are printed with (stdout, :class:`posfair.cli.terminal.Writer`): plain text wrapped at
    words to the terminal's width (or ``COLUMNS``); piped or redirected, to 80 columns (no escape codes), an
    ``error:`` line whole."""
    return Writer()


def progress_columns(columns: int) -> tuple:
    """rich's columns of a bar's line at ``columns`` wide: the label (cut at a word to :func:`label_width`), the
    bar (:func:`bar_room`), counts, elapsed and remaining time; together they fit the width."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.table import Column

    return (
        TextColumn("[bold]{task.description}", table_column=Column(width=label_width(columns), no_wrap=True)),
        BarColumn(bar_width=bar_room(columns)),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


def label_width(columns: int) -> int:
    """The progress bars' label column: three eighths of the width (at least 16; 30 at 80 columns, where an audit's
    ``n=3 [de, en, en] B128-L0.5-a0.5`` shows as ``n=3 [de, en… B128-L0.5-a0.5``: the instance and the setting
    both), so that the bar (17 at 80 columns), counts and times keep their room."""
    return max(16, columns * 3 // 8)


#: what a bar's line holds beside its label and bar: counts (``123,456/123,456``), elapsed and remaining times
#: (``0:00:00`` each) and the spaces between the five columns
_COUNTS_AND_TIMES = 15 + 7 + 7 + 4


def bar_room(columns: int) -> int:
    """The bar's width: what the line leaves beside the label, counts and times (at least 10), so that a bar's
    line fits ``columns`` and rich never squeezes the label or the counts ("54/..." at 80 columns)."""
    return max(10, columns - label_width(columns) - _COUNTS_AND_TIMES)
