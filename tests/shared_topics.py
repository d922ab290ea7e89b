"""Test data: audit observations whose segment sets share topics by hand (one place for the tests of
posfair.stats.clusters, joint_ols and the conservative clustering)."""

import itertools

import numpy as np
import pandas as pd


def shared_topic_table(seed=0):
    """Permutation data (n = 3) of 8 segment sets whose topics are shared by hand: sets 0-1-2 share topics (one
    component), 3-4 share one (a second), 5, 6 and 7 share none; a topic effect makes shared topics correlated, and
    the calibrated outcome shares part of the stock one's noise (paired)."""
    picks = [(0, 1, 2), (2, 3, 4), (4, 5, 6), (7, 8, 9), (9, 10, 11), (12, 13, 14), (15, 16, 17), (18, 19, 20)]
    components = [0, 0, 0, 1, 1, 2, 3, 4]  # by hand
    rng = np.random.default_rng(seed)
    effect = rng.normal(0, 0.08, 21)
    rows = []
    for s, pick in enumerate(picks):
        u = rng.normal(0, 0.03)
        for perm in itertools.permutations(range(3)):
            for p, k in enumerate(perm, start=1):
                e = rng.normal(0, 0.02)
                stock = 0.6 - 0.03 * (p - 1) + effect[pick[k]] + u + e
                cal = 0.6 - 0.01 * (p - 1) + 0.7 * effect[pick[k]] + u + 0.5 * e + rng.normal(0, 0.01)
                rows.append(
                    {"set": f"s{s}", "topic": f"t{pick[k]:02d}", "component": components[s], "position": p,
                     "stock": stock, "cal": cal}
                )  # fmt: skip
    return pd.DataFrame(rows)
