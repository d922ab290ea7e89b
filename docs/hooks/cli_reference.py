"""MkDocs hook: the command-line reference, rendered from the installed posfair's own ``--help``.

``<!-- posfair-cli-help -->`` on a page becomes one section per command (``posfair.cli.app.COMMANDS``, in their
order), each holding what ``posfair COMMAND --help`` prints at 80 columns, so the reference cannot fall behind
the code.  The help is rendered in-process through the same click command the ``posfair`` script runs.
"""

from __future__ import annotations

import contextlib
import io
import os

MARKER = "<!-- posfair-cli-help -->"


def command_help(args: list[str]) -> str:
    """What ``posfair ARGS --help`` prints at 80 columns (the help of the root with ``args`` empty)."""
    import typer.main

    from posfair.cli.app import app

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            try:
                typer.main.get_command(app).main(args=[*args, "--help"], prog_name="posfair", standalone_mode=False)
            except SystemExit:
                pass
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue().rstrip() + "\n"


def reference_markdown() -> str:
    """One ``### posfair NAME`` section per command, each with its help in a text block."""
    from posfair.cli.app import COMMANDS

    parts = [f"```text\n{command_help([])}```\n"]
    for name in COMMANDS:
        parts.append(f"### posfair {name}\n\n```text\n{command_help([name])}```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 -- MkDocs' hook signature
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference_markdown())
