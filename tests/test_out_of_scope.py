"""Refusal thresholds chosen on in-scope examples, and out-of-scope scores (openbook/out_of_scope.py)."""

from __future__ import annotations

import numpy as np
import pytest
from openbook.out_of_scope import out_of_scope_scores, threshold_within_cost


def _brute_force(confidence: np.ndarray, correct: np.ndarray, max_cost: float) -> float:
    floor = correct.mean() - max_cost - 1e-12  # "within the cost" holds at exactly the cost, in floats too
    allowed = [t for t in np.unique(confidence) if (correct & (confidence >= t)).mean() >= floor]
    return float(max(allowed))


def test_the_threshold_is_the_highest_within_the_cost() -> None:
    confidence = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, True, False, True, False])  # answering all: 3 of 5
    assert threshold_within_cost(confidence, correct, 0.0) == 0.6  # refuses 0.5 only, a wrong one
    assert threshold_within_cost(confidence, correct, 0.2) == 0.8  # refuses 0.6 too: 2 of 5 right
    assert threshold_within_cost(confidence, correct, 1.0) == 0.9


def test_ties_are_kept_or_refused_together_and_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        confidence = rng.choice([0.2, 0.4, 0.5, 0.7, 0.9], size=40)
        correct = rng.random(40) < confidence
        for cost in (0.0, 0.01, 0.03, 0.1):
            assert threshold_within_cost(confidence, correct, cost) == _brute_force(confidence, correct, cost)
    with pytest.raises(ValueError, match="at least one"):
        threshold_within_cost(np.array([]), np.array([], dtype=bool), 0.03)


def test_out_of_scope_scores() -> None:
    scores = out_of_scope_scores(
        np.array([0.9, 0.8, 0.3]), np.array([True, False, True]), np.array([0.2, 0.6, 0.1, 0.4]), 0.5
    )
    assert scores.in_scope_refused == pytest.approx(1 / 3) and scores.in_scope_accuracy == pytest.approx(
        1 / 3
    )
    assert scores.in_scope_accuracy_answering_all == pytest.approx(2 / 3)
    assert scores.recall == 0.75 and scores.precision == 0.75  # 3 of 4 refusals were out of scope
