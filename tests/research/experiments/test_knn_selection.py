"""The nested dev-only check of kNN-interpolation rules (`experiments/knn_selection.py`) on synthetic seeds.

The command end to end on a tiny backbone is in tests/cli/test_knn_selection.py.
"""

import numpy as np
from openbook.selection import SelectionRule

from research.experiments.knn_selection import (
    BASELINE,
    RULES,
    CheckedRule,
    SeedEmbeddings,
    cached_embeddings,
    check_table,
    nested_check,
    run_check,
    seed_evidence,
    stratified_halves,
)


def synthetic_seed(store_is_right: bool, prompt_is_right: bool, per_label: int = 8) -> SeedEmbeddings:
    """Two labels. Slot vectors cluster by label (or are noise); label scores favour gold (or a coin flip)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((2, 16))

    def split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        split_rng = np.random.default_rng(seed)
        labels = np.repeat([0, 1], per_label)
        noise = split_rng.standard_normal((len(labels), 16))
        vectors = centres[labels] + 0.1 * noise if store_is_right else noise
        favoured = labels if prompt_is_right else split_rng.integers(0, 2, len(labels))
        scores = np.where(np.arange(2) == favoured[:, None], 0.0, -1.0)  # log-probs up to a constant
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return unit.astype(np.float32), scores.astype(np.float32), labels

    train, dev = split(1), split(2)
    return SeedEmbeddings(*train, *dev, label_bias=np.zeros(2, np.float32))


def test_stratified_halves_split_every_label_in_two_disjoint_halves():
    labels = np.array([0] * 8 + [1] * 5 + [2] * 2)
    first, second = stratified_halves(labels, np.random.default_rng(0))
    assert sorted([*first, *second]) == list(range(len(labels)))
    assert [int((labels[first] == c).sum()) for c in range(3)] == [4, 3, 1]
    assert [int((labels[second] == c).sum()) for c in range(3)] == [4, 2, 1]
    again = stratified_halves(labels, np.random.default_rng(0))
    assert (again[0] == first).all()  # a seeded split is reproducible


def test_the_training_examples_are_scored_leave_one_out():
    evidence = seed_evidence(synthetic_seed(store_is_right=True, prompt_is_right=False))
    hits = evidence.train.split.hits
    assert hits is not None and evidence.store_size == 16
    assert not (hits.ids == np.arange(16)[:, None]).any() and (hits.ids[:, :15] >= 0).all()
    assert hits.ids.shape == (16, 16) and (hits.ids[:, 15] == -1).all()  # 15 others; the last slot empty


def test_a_rule_that_reads_the_store_wins_held_out_where_the_store_is_right():
    outcomes = nested_check(
        seed_evidence(synthetic_seed(store_is_right=True, prompt_is_right=False)), RULES, splits=3, seed=13
    )
    assert outcomes["λ, train LOO + dev, accuracy"].held_out_accuracy == 1.0
    assert outcomes["λ, train LOO + dev, accuracy"].mean_lambda >= 0.5
    assert outcomes["zero-shot (λ = 0)"].held_out_accuracy < 0.8
    assert len(outcomes["zero-shot (λ = 0)"].chosen) == 3 * 2  # each split, both ways round


def test_a_rule_keeps_to_the_prompt_where_the_store_is_noise():
    outcomes = nested_check(
        seed_evidence(synthetic_seed(store_is_right=False, prompt_is_right=True)), RULES, splits=2, seed=13
    )
    for name in ("λ, dev, accuracy", "λ, train LOO + dev, accuracy", "λ, train LOO + dev, log-likelihood"):
        assert outcomes[name].held_out_accuracy == 1.0 and outcomes[name].mean_lambda <= 0.5, name


def test_embeddings_are_cached_once_and_read_back_exactly(tmp_path):
    embeddings = synthetic_seed(store_is_right=True, prompt_is_right=True)
    calls = []

    def embed() -> SeedEmbeddings:
        calls.append(1)
        return embeddings

    path = tmp_path / "embeddings" / "toy-1.npz"
    first, second = cached_embeddings(path, embed), cached_embeddings(path, embed)
    assert len(calls) == 1 and first is embeddings
    for name in ("train_vectors", "dev_lm_log_probs", "train_labels", "label_bias"):
        assert np.array_equal(getattr(second, name), getattr(embeddings, name))


def test_run_check_and_its_table():
    seeds = {("a", 1): synthetic_seed(True, False), ("a", 2): synthetic_seed(False, True)}
    rules = [CheckedRule("zero-shot", SelectionRule(lambdas=(0.0,)), "dev"), RULES[2]]
    assert RULES[2].name == BASELINE
    records = run_check(["a"], [1, 2], lambda task, seed: seeds[task, seed], splits=1, rules=rules)
    assert [(r.seed, r.rule) for r in records] == [(s, rule.name) for s in (1, 2) for rule in rules]
    table = check_table(records).splitlines()
    assert table[0] == f"| selection rule | a | mean | mean λ chosen | vs {BASELINE} | wins / losses |"
    by = {(r.rule, r.seed): 100 * r.held_out_accuracy for r in records}
    gains = np.array([by["zero-shot", s] - by[BASELINE, s] for s in (1, 2)])
    mean = (by["zero-shot", 1] + by["zero-shot", 2]) / 2
    paired = f"{gains.mean():+.1f} ({gains.std(ddof=1) / np.sqrt(2):.1f})"
    tally = f"{int((gains > 0).sum())} / {int((gains < 0).sum())}"
    assert table[2] == f"| zero-shot | {mean:.1f} | {mean:.1f} | 0.00 | {paired} | {tally} |"
    assert table[3].endswith("| +0.0 (0.0) | 0 / 0 |")  # the baseline against itself
