"""`lambda_on_store.py`: a classifier whose `knn.lam` is None predicts with λ chosen on its stored examples,
each left out in turn (`selection.lambda_on_store`), and keeps it level with the store."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from openbook.checkpoints import save_classifier
from openbook.knn import KnnConfig
from openbook.lambda_on_store import UNCHOSEN_LAM
from openbook.methods import build_method
from openbook.selection import lambda_on_store
from openbook.training import TrainConfig
from openbook.untrained import UNTRAINED_KNN, build_classifier

TEMPLATE = "{text} It was {mask}"
WORDS = ("yes", "no", "so", "it", "a")
# Two clusters of near-identical texts whose labels the store tells apart and the prompt does not.
CLUSTERS = [
    *((f"{w} the movie was great and fun", "a") for w in WORDS),
    *((f"{w} who wrote the book about the river", "b") for w in WORDS),
]
QUERIES = ["the movie was great and fun", "who wrote the book", "a bad film"]


def untrained(backbone, labels=None, knn: KnnConfig = UNTRAINED_KNN):
    return build_classifier(backbone, TEMPLATE, labels or {"a": "good", "b": "bad"}, knn=knn)


def expected_lam(classifier) -> float:
    """λ by the library's rule, from the stored examples' label scores computed afresh."""
    ids = classifier.store.ids()
    texts = classifier.store.texts_of(ids)
    lam = lambda_on_store(classifier, ids, classifier.embed(texts, vectors_only=True).lm_log_probs).lam
    assert lam is not None
    return lam


def probabilities(predictions) -> np.ndarray:
    return np.array([list(p.probabilities.values()) for p in predictions])


def test_lambda_none_predicts_as_the_lambda_the_rule_chooses(causal_backbone) -> None:
    choosing = untrained(causal_backbone)
    assert choosing.knn.lam is None
    texts, labels = [t for t, _ in CLUSTERS], [y for _, y in CLUSTERS]
    choosing.add_examples(texts, labels)
    lam = expected_lam(choosing)
    assert lam > 0.5  # the store tells the clusters apart; the prompt does not
    given = untrained(causal_backbone, knn=dataclasses.replace(UNTRAINED_KNN, lam=lam))
    given.add_examples(texts, labels)
    assert choosing.served_knn() == given.knn
    ours, theirs = choosing.predict(QUERIES), given.predict(QUERIES)
    np.testing.assert_array_equal(probabilities(ours), probabilities(theirs))
    assert [p.neighbours for p in ours] == [p.neighbours for p in theirs]
    assert sorted(choosing.lam_on_store.scores) == choosing.store.ids().tolist()  # scored with the keys
    assert not given.lam_on_store.scores  # a λ given: nothing kept for it


def test_adding_and_removing_examples_chooses_again(causal_backbone) -> None:
    classifier = untrained(causal_backbone)
    assert classifier.served_knn().lam == 0.0  # no example: the prompt alone
    classifier.add_examples([CLUSTERS[0][0]], ["a"])
    assert classifier.served_knn().lam == 0.0  # one label stored: its P_kNN names it whatever the query
    classifier.add_examples([t for t, _ in CLUSTERS[1:]], [y for _, y in CLUSTERS[1:]], ids=range(1, 10))
    both = classifier.served_knn().lam
    assert both == expected_lam(classifier) and both is not None and both > 0.5
    assert classifier.remove_examples(np.arange(5, 10)) == 5  # every "b" example
    assert classifier.served_knn().lam == 0.0 == expected_lam(classifier)
    assert sorted(classifier.lam_on_store.scores) == [0, 1, 2, 3, 4]
    # relabelled (replaced under its id): one stored example now names the other label
    classifier.add_examples([CLUSTERS[9][0]], ["b"], ids=[4])
    assert classifier.served_knn().lam == expected_lam(classifier)


def test_keys_stored_alone_serve_the_lambda_before_until_their_scores_are_kept(causal_backbone) -> None:
    """How the service spares a request the pass over the label words' tree: the keys now, the scores
    later (`missing`, then `keep`); meanwhile the λ chosen before serves."""
    classifier = untrained(causal_backbone)
    texts, labels = [t for t, _ in CLUSTERS], [y for _, y in CLUSTERS]
    keys = classifier.embed_vectors(texts)
    classifier.add_embeddings(keys, labels, np.arange(10), texts=texts)
    assert classifier.served_knn().lam == UNCHOSEN_LAM  # nothing chosen yet
    ids, missing = classifier.lam_on_store.missing(classifier.store)
    assert ids.tolist() == list(range(10)) and missing == texts
    scores = classifier.embed(missing, vectors_only=True).lm_log_probs
    # meanwhile, example 9 was deleted and stored again under another text: its score is not kept
    classifier.remove_examples([9])
    classifier.add_embeddings(classifier.embed_vectors(["a bad film"]), ["b"], [9], texts=["a bad film"])
    classifier.lam_on_store.keep(classifier.store, ids, missing, scores)
    assert classifier.lam_on_store.missing(classifier.store)[0].tolist() == [9]
    assert classifier.served_knn().lam == UNCHOSEN_LAM
    classifier.score_unscored()
    assert classifier.served_knn().lam == expected_lam(classifier)


def test_a_classifier_grown_by_labels_scores_its_examples_again(causal_backbone) -> None:
    from openbook.labels import add_label

    classifier = untrained(causal_backbone)
    classifier.add_examples([t for t, _ in CLUSTERS], [y for _, y in CLUSTERS])
    grown = add_label(classifier, "c", "fun")
    assert grown.store is classifier.store and not grown.lam_on_store.scores  # the scores had 2 labels
    assert grown.lam_on_store.missing(grown.store)[0].tolist() == classifier.store.ids().tolist()
    grown.score_unscored()
    assert {row.shape for row in grown.lam_on_store.scores.values()} == {(3,)}
    assert grown.served_knn().lam == expected_lam(grown)


def test_the_knn_settings_or_the_label_bias_changed_choose_again(causal_backbone) -> None:
    classifier = untrained(causal_backbone)
    classifier.add_examples([t for t, _ in CLUSTERS], [y for _, y in CLUSTERS])
    classifier.label_bias = np.zeros(2)
    assert classifier.served_knn().lam == expected_lam(classifier) == 1.0
    classifier.knn = dataclasses.replace(classifier.knn, temperature=10.0)  # P_kNN all but flat
    assert classifier.served_knn().lam == expected_lam(classifier) == 0.0
    classifier.label_bias = np.array([5.0, -5.0])  # the prompt now sure of "a" everywhere
    lam = classifier.served_knn().lam
    assert lam == expected_lam(classifier) and lam is not None and lam > 0.0


def test_a_checkpoint_keeps_a_number(causal_backbone, tmp_path) -> None:
    classifier = untrained(causal_backbone)
    with pytest.raises(ValueError, match="chosen on dev"):
        save_classifier(
            tmp_path / "ckpt",
            classifier,
            build_method("retroprompt"),
            base_weights_sha256="0" * 64,
            train_config=TrainConfig(),
            training_data_sha256="0" * 64,
            dev_metrics={},
        )
    assert not (tmp_path / "ckpt").exists()
