"""The first-use check's parts (`experiments/first_use.py`): the nested draws and the leave-one-out λ."""

import numpy as np
import pytest
from openbook.classifier import Classifier, Embeddings
from openbook.experiments.first_use import draw_per_class, leave_one_out_lambda
from openbook.prompting import Template, Verbalizer


def test_draws_take_each_class_nested_across_counts():
    labels = np.array([0, 1, 0, 2, 1, 0, 1, 0, 1, 1])  # class 2 has a single example
    two, three = draw_per_class(labels, 2, seed=5), draw_per_class(labels, 3, seed=5)
    assert np.bincount(labels[two]).tolist() == [2, 2, 1] and np.bincount(labels[three]).tolist() == [3, 3, 1]
    assert set(two) <= set(three)
    with pytest.raises(ValueError, match="at least 1"):
        draw_per_class(labels, 0, seed=5)


def _classifier_with(backbone, vectors: np.ndarray, lm_scores: np.ndarray, labels: list[str]):
    classifier = Classifier(backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    stored = Embeddings(vectors.astype(np.float32), lm_scores.astype(np.float32), np.zeros(len(labels), bool))
    return classifier, classifier.add_embeddings(stored, labels), stored


@pytest.mark.parametrize("store_is_right", [True, False])
def test_the_leave_one_out_lambda_follows_which_side_is_right(causal_backbone, store_is_right):
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 4)
    centres = rng.standard_normal((2, causal_backbone.hidden_size))
    vectors = centres[labels] + 0.05 * rng.standard_normal((8, causal_backbone.hidden_size))
    if not store_is_right:
        vectors = rng.standard_normal((8, causal_backbone.hidden_size))  # neighbours carry no label
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    favoured = 1 - labels if store_is_right else labels  # the prompt is wrong where the store is right
    scores = np.where(np.arange(2) == favoured[:, None], 0.0, -1.0)
    classifier, ids, stored = _classifier_with(causal_backbone, vectors, scores, [str(y) for y in labels])
    chosen = leave_one_out_lambda(classifier, ids, stored)
    assert (chosen.lam == 1.0) if store_is_right else (chosen.lam == 0.0)
    assert (chosen.k, chosen.temperature) == (classifier.knn.k, classifier.knn.temperature)


def test_a_single_stored_example_keeps_the_default(causal_backbone):
    vectors = np.ones((1, causal_backbone.hidden_size)) / np.sqrt(causal_backbone.hidden_size)
    classifier, ids, stored = _classifier_with(causal_backbone, vectors, np.zeros((1, 2)), ["1"])
    assert leave_one_out_lambda(classifier, ids, stored) == classifier.knn
