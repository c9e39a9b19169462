"""Refusing out-of-scope queries with a threshold chosen on in-scope examples alone.

A deployed intent classifier meets queries that fit none of its labels (CLINC150's out-of-scope set:
Larson et al., EMNLP 2019), yet its users label only the intents it serves. So the refusal threshold
(a task's `min_confidence`) is chosen from in-scope dev examples alone: the highest threshold whose
in-scope accuracy, every refusal counted as an error, stays within `max_cost` of answering every query.
Out-of-scope queries are then only scored, never used to choose.

What is thresholded: where a sentence reader keys the book, the similarity of a query to its nearest
stored example (`Classifier.min_similarity`, chosen by `fitting` on dev at a cost of REFUSAL_COST); the
held-out-intents judge chose it over the prediction's confidence, 71.0% of pseudo-out-of-scope queries
refused against 44.7% (docs/experiments/two-readers.md, "The refusal judge read"). The service's
`min_confidence` thresholds the confidence, as a user sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REFUSAL_COST = 0.03  # at most 3 points of in-scope dev accuracy, refusals counted as errors


def threshold_within_cost(confidence: np.ndarray, correct: np.ndarray, max_cost: float) -> float:
    """The highest threshold t such that the share of in-scope examples answered (confidence >= t) and
    right is at least the accuracy of answering all, less `max_cost`. `confidence`: (N,) the probability
    of each example's predicted label; `correct`: (N,) whether that label is its gold one."""
    if len(confidence) == 0 or len(confidence) != len(correct):
        raise ValueError("one confidence and one correctness per in-scope example, at least one")
    if not 0 <= max_cost <= 1:
        raise ValueError(f"max_cost is a share of accuracy in [0, 1], got {max_cost}")
    order = np.argsort(-confidence, kind="stable")  # most confident first
    ranked, right = confidence[order], correct[order].astype(np.float64)
    kept_right = np.cumsum(right) / len(ranked)  # (N,) accuracy, refusals wrong, at t = ranked[i]
    last_of_tie = np.r_[ranked[1:] != ranked[:-1], True]  # t = ranked[i] keeps every tie of it
    allowed = last_of_tie & (kept_right >= right.mean() - max_cost - 1e-12)
    return float(ranked[np.flatnonzero(allowed)[0]])


@dataclass(frozen=True)
class OutOfScope:
    threshold: float
    in_scope_accuracy: float  # refusals counted as errors
    in_scope_accuracy_answering_all: float
    in_scope_refused: float  # share of in-scope queries refused
    recall: float  # share of out-of-scope queries refused
    precision: float  # share of refusals that were out of scope (1.0 with none)


def out_of_scope_scores(
    in_confidence: np.ndarray, in_correct: np.ndarray, oos_confidence: np.ndarray, threshold: float
) -> OutOfScope:
    """How a threshold does on in-scope queries (with their correctness) and out-of-scope ones."""
    in_refused, oos_refused = in_confidence < threshold, oos_confidence < threshold
    refusals = int(in_refused.sum() + oos_refused.sum())
    return OutOfScope(
        threshold=float(threshold),
        in_scope_accuracy=float((in_correct & ~in_refused).mean()),
        in_scope_accuracy_answering_all=float(in_correct.mean()),
        in_scope_refused=float(in_refused.mean()),
        recall=float(oos_refused.mean()),
        precision=float(oos_refused.sum() / refusals) if refusals else 1.0,
    )
