"""posfair.retrieval."""
