"""posfair.fairness."""
