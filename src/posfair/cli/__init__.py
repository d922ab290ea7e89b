"""The ``posfair`` command line: one module per command, shared options, one error boundary.

* :mod:`posfair.cli.app`: the Typer application, :data:`~posfair.cli.app.COMMANDS` (every command and its
  function) and :func:`main` (the ``posfair`` script);
* one module per command, named as the command: ``encode``, ``embed``, ``serve``, ``audit``, ``demo``,
  ``attention``, ``retrieval``, ``sweep``, ``build_benchmark``, ``tune``, ``verify``, ``estimate_prior``;
  a command module imports no other command module;
* the modules the commands share: :mod:`posfair.cli.options` (every shared option), :mod:`posfair.cli.parsers`
  (the parsers of option values), :mod:`posfair.cli.error_boundary` (one ``error:`` line, exit 2 / 1),
  :mod:`posfair.cli.checks` (the checks run before any work), :mod:`posfair.cli.inputs` (the corpus, documents
  and benchmark size several commands load), :mod:`posfair.cli.runs` (the audit and benchmark runs two commands
  share), :mod:`posfair.cli.terminal` (the one writer of every line a command prints, wrapped at words to the
  width), :mod:`posfair.cli.terminal_progress` (the progress bars), :mod:`posfair.cli.terminal_tables` (tables
  as text), :mod:`posfair.cli.aliases` (former option names).
"""

# imported here, not lazily (posfair.runtime.lazy): the name ``app`` is also the submodule posfair.cli.app, and importing
# a submodule sets the package's attribute of its name, so a lazy ``app`` would turn into the module
from posfair.cli.app import app, main

__all__ = ["app", "main"]
