"""Choosing kNN interpolation's k, T and lambda (`selection.py`): on hand-made neighbours, on synthetic
stores whose answer is known, and against a brute-force reference."""

import dataclasses
import itertools

import numpy as np
import pytest
from openbook.classifier import Classifier
from openbook.fitting import choose_knn_on_dev
from openbook.knn import KnnConfig, knn_mixture
from openbook.predictions import Embeddings
from openbook.prompting import Template, Verbalizer
from openbook.selection import (
    DEFAULT_RULE,
    JOINT_RULE,
    LAMBDA_GRID,
    Evidence,
    SelectionRule,
    Split,
    accuracy,
    gold_log_likelihood,
    lambda_on_store,
    lambda_rule,
    leave_one_out_evidence,
    pooled,
    select,
    select_on_dev,
)
from openbook.store import KnowledgeStore, SearchResult


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


def test_the_default_rule_varies_lambda_alone_at_the_default_k_and_temperature():
    default = KnnConfig()
    assert DEFAULT_RULE.grid(100) == [(default.k, default.temperature, lam) for lam in LAMBDA_GRID]
    assert {k for k, _, _ in DEFAULT_RULE.grid(5)} == {5}  # never more neighbours than the store holds
    assert DEFAULT_RULE.criterion == "accuracy"


def test_dev_accuracy_ties_are_broken_by_the_gold_log_likelihood():
    # The prompt (0.6 on gold) and the neighbours (all gold) are right on every row: every lambda scores
    # 100% on dev, and the gold probability, lam + (1 - lam) * 0.6, is highest at lambda 1.
    gold = np.array([0, 1, 0, 1])
    p_lm = np.where(gold[:, None] == np.arange(2), 0.6, 0.4).astype(np.float32)
    dev = Split(gold, neighbours(np.repeat(gold[:, None], 4, 1)))
    chosen, dev_accuracy = select_on_dev(p_lm, dev, DEFAULT_RULE.grid(4), store_size=4)
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


def test_a_rule_validates_its_grid_and_cuts_k_to_the_store():
    with pytest.raises(ValueError, match="at least one"):
        SelectionRule(lambdas=())
    with pytest.raises(ValueError, match="lam must be"):
        SelectionRule(lambdas=(1.5,))
    with pytest.raises(ValueError, match="criterion"):
        SelectionRule(criterion="loss")  # type: ignore[arg-type]
    assert len(JOINT_RULE.grid(100)) == 6 * 5 * 11
    # k = 8, 16 and 32 all become 5: their points coincide and are kept once, in order
    assert [k for k, _, _ in SelectionRule(ks=(1, 8, 16, 32), lambdas=(0.5,)).grid(5)] == [1, 5]


def clustered(count_per_label: int, num_labels: int, dim: int, spread: float, seed: int):
    """Unit vectors around one random centre per label (spread 0: on it), and their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_labels, dim))
    labels = np.repeat(np.arange(num_labels), count_per_label)
    vectors = centres[labels] + spread * rng.standard_normal((len(labels), dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32), labels


def prompt_guesses(labels: np.ndarray, num_labels: int, right: float, seed: int) -> np.ndarray:
    """A P_LM with 0.6 on the gold label for a `right` share of rows, and 0.6 on another label elsewhere."""
    rng = np.random.default_rng(seed)
    favoured = np.where(rng.random(len(labels)) < right, labels, (labels + 1) % num_labels)
    p = np.full((len(labels), num_labels), 0.4 / (num_labels - 1), np.float32)
    p[np.arange(len(labels)), favoured] = 0.6
    return p


def evidence_for(store_spread: float, queries_spread: float, right: float) -> tuple[Evidence, int]:
    """Train (16 per label, stored, scored leave-one-out) pooled with dev (16 per label) for 3 labels."""
    train_vectors, train_labels = clustered(16, 3, 24, store_spread, seed=0)
    dev_vectors, dev_labels = clustered(16, 3, 24, queries_spread, seed=0)  # the same centres
    ids = np.arange(len(train_labels))
    store = KnowledgeStore(24)
    store.add(ids, train_vectors, train_labels)
    train = leave_one_out_evidence(
        store, ids, train_vectors, prompt_guesses(train_labels, 3, right, 1), train_labels, 32, "cosine"
    )
    dev = Evidence(prompt_guesses(dev_labels, 3, right, 2), Split(dev_labels, store.search(dev_vectors, 32)))
    return pooled([train, dev]), len(store)


def test_a_store_whose_neighbours_are_always_right_gets_a_high_lambda():
    evidence, size = evidence_for(store_spread=0.1, queries_spread=0.1, right=0.6)
    chosen, evidence_accuracy = select(evidence, SelectionRule(), size)
    assert chosen.lam >= 0.8 and evidence_accuracy == 1.0


def test_a_store_of_noise_gets_lambda_zero_beside_a_prompt_that_is_right():
    # every lambda small enough keeps the prompt's answers; any weight on the noise lowers the gold's share
    evidence, size = evidence_for(store_spread=50.0, queries_spread=50.0, right=1.0)
    for criterion in ("accuracy", "log-likelihood"):
        chosen, _ = select(evidence, SelectionRule(criterion=criterion), size)
        assert chosen.lam == 0.0, criterion


def test_leave_one_out_never_retrieves_the_example_itself():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    vectors[1] = vectors[0]  # a twin: it is the other's nearest neighbour, itself excluded
    ids = rng.permutation(1000)[:40].astype(np.int64)
    labels = rng.integers(0, 3, 40)
    store = KnowledgeStore(8)
    store.add(ids, vectors, labels)
    hits = leave_one_out_evidence(
        store, ids, vectors, np.full((40, 3), 1 / 3), labels, 5, "cosine"
    ).split.hits
    assert hits is not None and not (hits.ids == ids[:, None]).any()
    assert hits.ids[0, 0] == ids[1] and hits.ids[1, 0] == ids[0]
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)  # brute force: the 5 best of the others
    expected = ids[np.argsort(-similarity, axis=1, kind="stable")[:, :5]]
    assert (np.sort(hits.ids, axis=1) == np.sort(expected, axis=1)).all()


def test_the_log_likelihood_criterion_picks_the_brute_force_maximiser():
    evidence, size = evidence_for(store_spread=1.0, queries_spread=1.0, right=0.7)
    rule = SelectionRule(ks=(4, 16), temperatures=(0.05, 0.3), criterion="log-likelihood")
    chosen, _ = select(evidence, rule, size)
    hits = evidence.split.hits
    assert hits is not None

    def log_likelihood(k: int, t: float, lam: float) -> float:
        p = knn_mixture(evidence.p_lm, hits.similarities, hits.labels, KnnConfig(k, t, lam))[1]
        return gold_log_likelihood(p, evidence.split.labels)

    best = max(itertools.product((4, 16), (0.05, 0.3), LAMBDA_GRID), key=lambda point: log_likelihood(*point))
    assert (chosen.k, chosen.temperature, chosen.lam) == best


def test_pooled_evidence_stacks_rows_and_keeps_the_neighbours_both_parts_have():
    first = Evidence(np.full((2, 2), 0.5), Split(np.array([0, 1]), neighbours(np.zeros((2, 4), np.int64))))
    second = Evidence(np.full((3, 2), 0.5), Split(np.array([1, 1, 0]), neighbours(np.ones((3, 6), np.int64))))
    both = pooled([first, second])
    assert len(both) == 5 and both.split.hits is not None and both.split.hits.ids.shape == (5, 4)
    assert list(both.split.labels) == [0, 1, 1, 1, 0] and list(both.split.hits.labels[:, 0]) == [
        0,
        0,
        1,
        1,
        1,
    ]
    assert list(both.rows(np.array([4, 0])).split.labels) == [0, 0]


def test_the_chosen_config_keeps_how_the_caller_scores_neighbours():
    """A rule chooses k, T and lambda; the similarity and the standardisation stay the base config's,
    and the standardised P_kNN is what the selection ranked."""
    evidence, size = evidence_for(store_spread=1.0, queries_spread=1.0, right=0.7)
    base = KnnConfig(similarity="centred", standardise=True, temperature=1.0)
    rule = SelectionRule(ks=(4, 16), temperatures=(0.3, 1.0), criterion="log-likelihood")
    chosen, _ = select(evidence, rule, size, base)
    assert (chosen.similarity, chosen.standardise) == ("centred", True)
    hits = evidence.split.hits
    assert hits is not None

    def log_likelihood(k: int, t: float, lam: float) -> float:
        config = dataclasses.replace(base, k=k, temperature=t, lam=lam)
        p = knn_mixture(evidence.p_lm, hits.similarities, hits.labels, config)[1]
        return gold_log_likelihood(p, evidence.split.labels)

    best = max(itertools.product((4, 16), (0.3, 1.0), LAMBDA_GRID), key=lambda point: log_likelihood(*point))
    assert (chosen.k, chosen.temperature, chosen.lam) == best
    assert lambda_rule(base).grid(100) == [(16, 1.0, lam) for lam in LAMBDA_GRID]
    assert lambda_rule(KnnConfig()) == DEFAULT_RULE


@pytest.mark.parametrize("scoring", [{"similarity": "centred"}, {"standardise": True, "temperature": 1.0}])
def test_a_trained_classifier_s_dev_accuracy_is_what_it_then_scores_under_any_scoring(
    scoring, causal_backbone, toy
):
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer, knn=KnnConfig(**scoring))
    classifier.add_examples(toy.texts, [toy.verbalizer.labels[i] for i in toy.labels])
    dev_texts, dev_labels = (
        ["great fun", "a good film", "boring and bad", "a terrible film"],
        np.array([1, 1, 0, 0]),
    )
    chosen, dev_accuracy = choose_knn_on_dev(classifier, dev_texts, dev_labels)
    assert (chosen.similarity, chosen.standardise) == (classifier.knn.similarity, classifier.knn.standardise)
    classifier.knn = chosen
    predicted = classifier.label_indices([p.label for p in classifier.predict(dev_texts)])
    assert dev_accuracy == accuracy(predicted, dev_labels)


def _classifier_with(backbone, vectors: np.ndarray, lm_scores: np.ndarray, labels: list[str]):
    classifier = Classifier(backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    stored = Embeddings(vectors.astype(np.float32), lm_scores.astype(np.float32), np.zeros(len(labels), bool))
    return classifier, classifier.add_embeddings(stored, labels), stored


@pytest.mark.parametrize("store_is_right", [True, False])
def test_the_lambda_chosen_on_the_store_follows_which_side_is_right(causal_backbone, store_is_right):
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
    chosen = lambda_on_store(classifier, ids, stored.lm_log_probs)
    assert (chosen.lam == 1.0) if store_is_right else (chosen.lam == 0.0)
    assert (chosen.k, chosen.temperature) == (classifier.knn.k, classifier.knn.temperature)


@pytest.mark.parametrize("count", [1, 4])
def test_a_store_of_one_label_gets_no_weight(causal_backbone, count):
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((count, causal_backbone.hidden_size))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = np.tile([-1.0, 0.0], (count, 1))  # the prompt leans to label 1 too; the store would win
    classifier, ids, stored = _classifier_with(causal_backbone, vectors, scores, ["1"] * count)
    chosen = lambda_on_store(classifier, ids, stored.lm_log_probs)
    assert chosen == dataclasses.replace(classifier.knn, lam=0.0)


def test_a_large_store_is_scored_on_an_even_spread_of_its_examples(causal_backbone, monkeypatch):
    import openbook.selection as selection

    monkeypatch.setattr(selection, "STORE_EVIDENCE_LIMIT", 4)
    rng = np.random.default_rng(1)
    labels = np.repeat([0, 1], 5)
    vectors = rng.standard_normal((10, causal_backbone.hidden_size))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = np.where(np.arange(2) == labels[:, None], 0.0, -1.0)  # the prompt is right on every one
    classifier, ids, stored = _classifier_with(causal_backbone, vectors, scores, [str(y) for y in labels])
    seen = []
    real = selection.leave_one_out_evidence

    def recording(store, picked, *rest):
        seen.append(picked)
        return real(store, picked, *rest)

    monkeypatch.setattr(selection, "leave_one_out_evidence", recording)
    lambda_on_store(classifier, ids, stored.lm_log_probs)
    assert seen[0].tolist() == ids[[0, 3, 6, 9]].tolist()
