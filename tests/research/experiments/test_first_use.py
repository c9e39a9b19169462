"""The first-use check's draws (`experiments/first_use.py`); the command end to end is in
tests/cli/test_first_use.py, the leave-one-out λ in tests/test_selection.py."""

import numpy as np
import pytest

from research.experiments.first_use import draw_per_class


def test_draws_take_each_class_nested_across_counts():
    labels = np.array([0, 1, 0, 2, 1, 0, 1, 0, 1, 1])  # class 2 has a single example
    two, three = draw_per_class(labels, 2, seed=5), draw_per_class(labels, 3, seed=5)
    assert np.bincount(labels[two]).tolist() == [2, 2, 1] and np.bincount(labels[three]).tolist() == [3, 3, 1]
    assert set(two) <= set(three)
    with pytest.raises(ValueError, match="at least 1"):
        draw_per_class(labels, 0, seed=5)
