"""The rule on how the readers combine, read on kept distributions (research/experiments/combining.py)."""

import numpy as np
import pytest

from research.experiments.combining import choose_lambda, combine_table, geometric, linear, read_run


def _run(task: str, p_lm: dict, p_knn: dict, gold: dict) -> dict:
    readings = {"zero-shot": p_lm, "book": p_knn}
    return {"task": task, "seed": 1, "gold": gold, "readings": readings}


def test_the_geometric_mix_runs_from_the_prompt_to_the_book():
    p_lm, p_knn = np.array([[0.7, 0.3]]), np.array([[0.2, 0.8]])
    assert np.allclose(geometric(p_lm, p_knn, 0.0), p_lm)
    assert np.allclose(geometric(p_lm, p_knn, 1.0), (p_knn + 1e-4) / (1 + 2e-4))
    assert geometric(p_lm, p_knn, 0.5).sum() == pytest.approx(1.0)


def test_lambda_goes_to_the_reader_dev_finds_right():
    gold = np.array([0, 1, 0, 1])
    right = np.eye(2)[gold] * 0.8 + 0.1
    wrong = right[:, ::-1]
    assert choose_lambda(wrong, right, gold, linear, "accuracy") > 0.5
    assert choose_lambda(right, wrong, gold, linear, "accuracy") == 0.0  # the first of equals
    assert choose_lambda(right, wrong, gold, linear, "log-likelihood") == 0.0


# Two dev sets (dev = test here, so each candidate is scored where it chose), each two rows, gold 0 then 1.
# The book sure and wrong on row one, mildly right on row two: linear mixing gets both right (λ 0.4),
# a product of experts cannot (row one wants λ < 0.19, row two λ > 0.32).
BOOK_SURE_WRONG = (np.array([[0.9, 0.1], [0.6, 0.4]]), np.array([[0.0, 1.0], [0.3, 0.7]]))
# The book sure and right where the prompt is sure and wrong, mildly wrong on row two: the product gets
# both (λ 0.2 up), linear mixing only one (it would need 0.44 < λ < 0.5).
BOOK_SURE_RIGHT = (np.array([[0.1, 0.9], [0.4, 0.6]]), np.array([[1.0, 0.0], [0.6, 0.4]]))


def _case(task: str, case: tuple[np.ndarray, np.ndarray]) -> dict:
    gold = np.array([0, 1])
    p_lm, p_knn = case
    return _run(task, {"dev": p_lm, "test": p_lm}, {"dev": p_knn, "test": p_knn}, {"dev": gold, "test": gold})


def test_each_candidate_reads_its_own_choice_of_lambda():
    sure_wrong, sure_right = _case("a", BOOK_SURE_WRONG), _case("a", BOOK_SURE_RIGHT)
    assert read_run(sure_wrong, linear, "accuracy") == {"lam": 0.4, "accuracy": 100.0}
    assert read_run(sure_wrong, geometric, "accuracy")["accuracy"] == 50.0
    product = read_run(sure_right, geometric, "accuracy")  # right on both from 0.2; ties go to the likelier
    assert product["accuracy"] == 100.0 and product["lam"] >= 0.2
    assert read_run(sure_right, linear, "accuracy")["accuracy"] == 50.0


def test_the_rule_replaces_linear_only_a_point_up_with_no_task_a_point_down():
    product_wins = combine_table([_case("a", BOOK_SURE_RIGHT), _case("b", BOOK_SURE_RIGHT)])
    assert (
        product_wins["table"]["geometric"]["mean"] == 100.0
        and product_wins["table"]["linear"]["mean"] == 50.0
    )
    assert product_wins["verdicts"]["geometric"]["replaces"] and product_wins["chosen"] == "geometric"
    assert combine_table([_case("a", BOOK_SURE_WRONG)])["chosen"] == "linear"
    # level on the mean, a task 50 points down: nothing replaces linear
    level = combine_table([_case("a", BOOK_SURE_RIGHT), _case("b", BOOK_SURE_WRONG)])
    assert level["verdicts"]["geometric"] == {"gain": 0.0, "worst_task": -50.0, "replaces": False}
    assert level["chosen"] == "linear"
