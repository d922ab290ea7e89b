"""The ``posfair`` application: the root options and the commands, one module each.

Only typer and the command modules' signatures are imported here; every command
imports the heavy library (torch, transformers, pandas, the pipelines) in its body,
so ``posfair --help`` and ``posfair COMMAND --help`` stay under a second.
"""

from __future__ import annotations

from typing import Annotated

import typer

from posfair.cli import (
    attention,
    audit,
    build_benchmark,
    demo,
    embed,
    encode,
    estimate_prior,
    fit,
    retrieval,
    serve,
    sweep,
    tune,
    verify,
)
from posfair.cli.error_boundary import PosfairGroup, one_line_warnings
from posfair.cli.help_text import PosfairCommand

__all__ = ["COMMANDS", "app", "main"]

app = typer.Typer(
    name="posfair",
    cls=PosfairGroup,
    help="Measure and repair positional bias in text-embedding models.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="On an unexpected error, print the traceback (also: POSFAIR_DEBUG=1).")
    ] = False,
) -> None:
    """Measure and repair positional bias in text-embedding models."""
    # every command prints library warnings (e.g. a damaged cache shard set aside) as one "warning: ..." line;
    # --debug itself is read by the error boundary (posfair.cli.error_boundary), which sees it before this runs
    ctx.with_resource(one_line_warnings())
    if version:
        from posfair import __version__
        from posfair.cli.terminal import say

        say(f"posfair {__version__}")
        raise typer.Exit()


#: every command, by its name on the command line: one module of posfair.cli each (``estimate-prior`` is
#: posfair/cli/estimate_prior.py); the modules beside them (options, parsers, checks, ...) are shared helpers
COMMANDS = {
    "encode": encode.encode,
    "embed": embed.embed,
    "serve": serve.serve,
    "audit": audit.audit,
    "demo": demo.demo,
    "attention": attention.attention,
    "retrieval": retrieval.retrieval,
    "sweep": sweep.sweep,
    "build-benchmark": build_benchmark.build_benchmark,
    "tune": tune.tune,
    "fit": fit.fit,
    "verify": verify.verify,
    "estimate-prior": estimate_prior.estimate_prior_command,
}
for name, function in COMMANDS.items():
    app.command(name=name, cls=PosfairCommand)(function)  # --help wrapped at white space only


def main(argv: list[str] | None = None) -> None:
    """The ``posfair`` script: run the command line (``argv`` default: ``sys.argv[1:]``) and exit with its code."""
    typer.main.get_command(app).main(args=argv, prog_name="posfair")
