"""Length-aware batching: hand-computed padding, the token budget, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from posfair.encoding.batching import fixed_batches, length_aware_batches, padded_tokens, padding_waste

# a synthetic shard alternating short and long texts, as a corpus of mixed sections does
LENGTHS = [10, 100, 10, 100, 10, 100]


def test_padding_waste_by_hand():
    naive = fixed_batches(len(LENGTHS), 3)  # [10, 100, 10] and [100, 10, 100]
    assert [b.tolist() for b in naive] == [[0, 1, 2], [3, 4, 5]]
    # padded: 3*100 + 3*100 = 600; real: 330; waste (600 - 330) / 330
    assert padded_tokens(LENGTHS, naive) == (330, 600)
    assert padding_waste(LENGTHS, naive) == pytest.approx(270 / 330)
    aware = length_aware_batches(LENGTHS, max_tokens=300, max_batch_size=3)
    # sorted longest first: [100, 100, 100] (300 // 100 = 3 fit), then [10, 10, 10]: padded 300 + 30 = 330
    assert [sorted(b.tolist()) for b in aware] == [[1, 3, 5], [0, 2, 4]]
    assert padded_tokens(LENGTHS, aware) == (330, 330)
    assert padding_waste(LENGTHS, aware) == 0.0


def test_batch_size_adapts_to_length_within_the_budget():
    lengths = [500, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 200, 200, 200]
    batches = length_aware_batches(lengths, max_tokens=400, max_batch_size=8)
    sizes = [len(b) for b in batches]
    # sorted: 500 > budget goes alone; then [200, 200] (400 // 200 = 2), [200, 40] (led by a 200),
    # then the nine remaining 40s: 400 // 40 = 10, capped at 8, and the last one
    assert sizes == [1, 2, 2, 8, 1]
    lengths = np.array(lengths)
    for b in batches[1:]:
        assert len(b) * lengths[b].max() <= 400
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))  # every text exactly once


def test_skewed_distribution_waste_drops():
    rng = np.random.default_rng(0)
    lengths = np.where(rng.random(512) < 0.8, rng.integers(8, 40, 512), rng.integers(200, 512, 512))
    naive = padding_waste(lengths, fixed_batches(len(lengths), 32))
    aware = padding_waste(lengths, length_aware_batches(lengths, max_tokens=32 * 512, max_batch_size=32))
    assert naive > 3.0 and aware < 0.2


def test_deterministic_and_validated():
    a = length_aware_batches([5, 5, 7, 5], max_tokens=10)
    b = length_aware_batches([5, 5, 7, 5], max_tokens=10)
    assert [x.tolist() for x in a] == [x.tolist() for x in b] == [[2], [0, 1], [3]]  # stable among equals
    with pytest.raises(ValueError):
        length_aware_batches([1], max_tokens=0)
    with pytest.raises(ValueError):
        padding_waste([], [])
