"""``python -m posfair.cli``: the same as the ``posfair`` script."""

from posfair.cli.app import main

main()
