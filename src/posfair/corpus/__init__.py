"""posfair.corpus."""
