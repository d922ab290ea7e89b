"""posfair.report."""
