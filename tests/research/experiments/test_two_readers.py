"""The two readers' probe records, read: probe 2's head mixed with the prompt at w = n / (n + 1)."""

import numpy as np

from research.experiments.two_readers import head_readings


def _book(per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows near two directions, one per label."""
    rng = np.random.default_rng(0)
    centres = np.eye(4)[:2]
    labels = np.repeat([0, 1], per_class)
    rows = centres[labels] + 0.05 * rng.standard_normal((len(labels), 4))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True), labels


def test_the_head_reads_the_book_and_the_prompt_weighs_less_as_examples_come():
    queries = np.eye(4)[:2]  # one query at each label's direction
    gold = np.array([0, 1])
    wrong_prompt = np.array([[0.0, 1.0], [1.0, 0.0]])  # the prompt sure of the other label
    for per_class, mix_right in ((1, 0.0), (8, 1.0)):  # w = 1/2, then 8/9
        book, labels = _book(per_class)
        read = head_readings(
            book, labels, {"dev": queries, "test": None}, {"dev": wrong_prompt, "test": None},
            {"dev": gold, "test": None}, 2,
        )  # fmt: skip
        assert read["head"]["dev_accuracy"] == 1.0 and read["head"]["accuracy"] is None
        assert read["head-mix"]["dev_accuracy"] == mix_right
