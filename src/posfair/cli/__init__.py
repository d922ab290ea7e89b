"""The ``posfair`` command line: one module per command, shared options, one error boundary.

* :mod:`posfair.cli.app`: the Typer application and :func:`main` (the ``posfair`` script);
* :mod:`posfair.cli.options`: every shared option; :mod:`posfair.cli.parsers`: the parsers of option values;
* :mod:`posfair.cli.errors`: the error boundary (one ``error:`` line, exit 2 / 1);
* :mod:`posfair.cli.checks`: the checks run before any work;
* :mod:`posfair.cli.progress`: the progress bars;
* one module per command: ``encode``, ``embed``, ``audit``, ``demo``, ``attention``,
  ``retrieval``, ``sweep``, ``build_benchmark``, ``tune``.
"""

from posfair.cli.app import app, main

__all__ = ["app", "main"]
