"""Choosing kNN interpolation's k, T and lambda on dev (`selection.py`), on hand-made neighbours."""

import numpy as np
import pytest
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.selection import (
    LAMBDA_GRID,
    Split,
    accuracy,
    choose_knn_on_dev,
    interpolation_grid,
    select_on_dev,
)
from openbook.store import SearchResult


def neighbours(labels: np.ndarray) -> SearchResult:
    """(N, k) hits that all have similarity 0.5, voting for `labels`."""
    n, k = labels.shape
    return SearchResult(
        np.arange(n * k).reshape(n, k), labels.astype(np.int64), np.full((n, k), 0.5, np.float32)
    )


def test_accuracy():
    gold = np.array([0, 0, 1, 1, 2])
    predicted = np.array([0, 1, 1, 1, 0])
    assert accuracy(predicted, gold) == pytest.approx(0.6)


def test_interpolation_grid_varies_lambda_alone_at_the_default_k_and_temperature():
    default = KnnConfig()
    assert interpolation_grid(100) == [(default.k, default.temperature, lam) for lam in LAMBDA_GRID]
    assert {k for k, _, _ in interpolation_grid(5)} == {5}  # never more neighbours than the store holds


def test_dev_accuracy_ties_are_broken_by_the_gold_log_likelihood():
    # The prompt (0.6 on gold) and the neighbours (all gold) are right on every row: every lambda scores
    # 100% on dev, and the gold probability, lam + (1 - lam) * 0.6, is highest at lambda 1.
    gold = np.array([0, 1, 0, 1])
    p_lm = np.where(gold[:, None] == np.arange(2), 0.6, 0.4).astype(np.float32)
    dev = Split(gold, neighbours(np.repeat(gold[:, None], 4, 1)))
    chosen, dev_accuracy = select_on_dev(p_lm, dev, interpolation_grid(4), store_size=4)
    assert chosen == KnnConfig(4, KnnConfig().temperature, 1.0) and dev_accuracy == 1.0


def test_grid_points_with_more_neighbours_than_the_store_holds_are_skipped():
    # The two nearest neighbours vote wrong, the next two right: k=4 would tie the vote and let the
    # prompt decide (right), k=2 makes every row wrong. The store holds 3, so k=4 is not an option.
    gold = np.array([0, 1])
    p_lm = np.where(gold[:, None] == np.arange(2), 0.6, 0.4).astype(np.float32)
    votes = np.concatenate([np.repeat((1 - gold)[:, None], 2, 1), np.repeat(gold[:, None], 2, 1)], axis=1)
    dev = Split(gold, neighbours(votes))
    chosen, dev_accuracy = select_on_dev(p_lm, dev, [(4, 0.1, 0.5), (2, 0.1, 0.5)], store_size=3)
    assert chosen.k == 2 and dev_accuracy == 0.0
    chosen, dev_accuracy = select_on_dev(p_lm, dev, [(4, 0.1, 0.5), (2, 0.1, 0.5)], store_size=4)
    assert chosen.k == 4 and dev_accuracy == 1.0


def test_the_dev_accuracy_reported_is_what_the_classifier_then_scores(causal_backbone, toy):
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    classifier.add_examples(toy.texts[:4], [toy.verbalizer.labels[i] for i in toy.labels[:4]])
    dev_texts, dev_labels = (
        ["great fun", "a good film", "boring and bad", "a terrible film"],
        np.array([1, 1, 0, 0]),
    )
    chosen, dev_accuracy = choose_knn_on_dev(classifier, dev_texts, dev_labels)
    assert (chosen.k, chosen.temperature) == (4, KnnConfig().temperature) and chosen.lam in LAMBDA_GRID
    classifier.knn = chosen
    predicted = classifier.label_indices([p.label for p in classifier.predict(dev_texts)])
    assert dev_accuracy == accuracy(predicted, dev_labels)
