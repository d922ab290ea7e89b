"""The σ profile's direction: its slope on position by hand, and the reversal sentence."""

import numpy as np
import pytest

from posfair.fairness.measures import profile_slope, profile_spread, reversal_text


def test_slope_is_the_least_squares_line_through_the_position_means():
    positions = np.array([1, 2, 3, 1, 2, 3, 1, 2, 3])
    values = np.array([0.60, 0.55, 0.50, 0.62, 0.57, 0.49, 0.58, 0.53, 0.51])
    means = [0.60, 0.55, 0.50]  # per position
    # slope = sum (x - 2)(m - mean m) / sum (x - 2)^2 = ((-1)(0.05) + (1)(-0.05)) / 2 = -0.05
    assert np.allclose([values[positions == p].mean() for p in (1, 2, 3)], means)
    assert profile_slope(values, positions) == pytest.approx(-0.05)
    assert profile_spread(values, positions) == pytest.approx(0.10)


def test_a_reversed_profile_is_named_and_a_flatter_one_is_not():
    stock = profile_slope(np.array([0.60, 0.55, 0.50]), np.array([1, 2, 3]))
    reversed_ = profile_slope(np.array([0.500, 0.530, 0.557]), np.array([1, 2, 3]))  # position 3 above position 1
    flatter = profile_slope(np.array([0.56, 0.55, 0.54]), np.array([1, 2, 3]))
    text = reversal_text(stock, reversed_, "B64")
    assert text is not None and text.startswith("B64 reverses the σ profile") and "later positions" in text
    assert "+0.0285" in text and "-0.0500" in text
    assert reversal_text(stock, flatter) is None
    assert reversal_text(stock, 0.0) is None  # perfectly flat is not a reversal
    assert reversal_text(0.0, reversed_) is None and reversal_text(float("nan"), reversed_) is None
