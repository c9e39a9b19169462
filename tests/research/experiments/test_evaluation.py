"""The k-shot evaluation harness's own arithmetic: macro-F1 and the kNN-interpolation method.

The harness end to end runs through `python -m research eval` in tests/research/cli/test_evaluate.py.
"""

import numpy as np
import pytest
from openbook.knn import KnnConfig
from openbook.selection import Evidence, Split
from openbook.store import SearchResult

from research.experiments.evaluation import (
    OUT_OF_SCOPE,
    OUT_OF_SCOPE_MAX_COST,
    MethodInputs,
    MethodResult,
    knn_interp,
    knn_interp_dev,
    macro_f1,
    out_of_scope_on_test,
    scores_on_test,
)


def test_macro_f1():
    gold = np.array([0, 0, 1, 1, 2])
    predicted = np.array([0, 1, 1, 1, 0])
    # per class F1: 0 -> 2*1/(2+1+1)=0.5, 1 -> 2*2/(4+1+0)=0.8, 2 -> 0
    assert macro_f1(predicted, gold, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)


def test_knn_interp_chooses_lambda_alone_with_the_default_k_and_temperature():
    default = KnnConfig()
    # Dev: the prompt is right on every row and the neighbours always vote for the other label,
    # so the only lambda that keeps dev accuracy is 0.
    n, k = 8, 16
    gold = np.array([0, 1] * (n // 2))
    p_lm = np.where(gold[:, None] == np.arange(2), 0.7, 0.3).astype(np.float32)
    wrong = np.repeat((1 - gold)[:, None], k, 1).astype(np.int64)
    hits = SearchResult(np.arange(n * k).reshape(n, k), wrong, np.full((n, k), 0.5, np.float32))
    split = Split(gold, hits)
    inputs = MethodInputs(2, p_lm, p_lm, split, split, store_size=32)
    params = knn_interp(inputs).params
    assert (params["k"], params["temperature"], params["lam"]) == (default.k, default.temperature, 0.0)


def test_knn_interp_pools_the_frozen_training_examples_with_dev_and_says_so():
    # Dev (4 rows): the prompt is right and the neighbours wrong, so dev alone keeps lambda at 0. The
    # training examples, scored leave-one-out (20 rows), say the opposite: the neighbours right, the
    # prompt wrong. Pooled, they outnumber dev and lambda rises.
    k = 16

    def rows(n: int, prompt_right: bool, neighbours_right: bool) -> tuple[np.ndarray, np.ndarray, Split]:
        gold = np.array([0, 1] * (n // 2))
        favoured = gold if prompt_right else 1 - gold
        p_lm = np.where(favoured[:, None] == np.arange(2), 0.7, 0.3).astype(np.float32)
        votes = np.repeat((gold if neighbours_right else 1 - gold)[:, None], k, 1).astype(np.int64)
        hits = SearchResult(np.arange(n * k).reshape(n, k), votes, np.full((n, k), 0.5, np.float32))
        return gold, p_lm, Split(gold, hits)

    _, p_dev, dev = rows(4, prompt_right=True, neighbours_right=False)
    _, p_train, train = rows(20, prompt_right=False, neighbours_right=True)
    alone = MethodInputs(2, p_dev, p_dev, dev, dev, store_size=32)
    params = knn_interp(alone).params
    assert params["lam"] == 0.0 and params["selected_on"] == "dev" and params["dev_accuracy"] == 1.0
    frozen = MethodInputs(2, p_dev, p_dev, dev, dev, store_size=32, train=Evidence(p_train, train))
    params = knn_interp(frozen).params
    assert params["lam"] > 0.5 and params["selected_on"] == "train (leave-one-out) + dev"
    assert params["dev_accuracy"] == 0.0  # the chosen lambda, scored on dev alone
    params = knn_interp_dev(frozen).params  # the earlier rule ignores them
    assert params["lam"] == 0.0 and params["selected_on"] == "dev"


def test_out_of_scope_queries_are_refused_by_a_threshold_chosen_on_in_scope_dev_alone():
    # Dev: 10 in-scope rows, right at confidence 0.9 and wrong at 0.6 (two of them). Dropping the wrong
    # rows' confidence level costs no accuracy, so the threshold rises to 0.9 within the 3-point cost.
    p_dev = np.array([[0.9, 0.1]] * 8 + [[0.6, 0.4]] * 2)
    dev_labels = np.array([0] * 8 + [1] * 2)
    # Test: 4 in-scope rows (3 right at 0.95, 1 right at 0.6) then 3 out-of-scope rows (0.55, 0.7, 0.92).
    p_test = np.array([[0.95, 0.05]] * 3 + [[0.4, 0.6]] + [[0.55, 0.45], [0.3, 0.7], [0.92, 0.08]])
    test_labels = np.array([0, 0, 0, 1, OUT_OF_SCOPE, OUT_OF_SCOPE, OUT_OF_SCOPE])
    result = MethodResult(p_test, {}, p_dev)
    assert scores_on_test(p_test, test_labels, 2) == (1.0, 1.0)  # the in-scope rows alone
    scores = out_of_scope_on_test(result, dev_labels, test_labels)["out_of_scope"]
    assert scores["threshold"] == 0.9 and scores["max_cost"] == OUT_OF_SCOPE_MAX_COST
    assert scores["in_scope_accuracy"] == 0.75 and scores["in_scope_refused"] == 0.25
    assert scores["recall"] == pytest.approx(2 / 3) and scores["precision"] == pytest.approx(2 / 3)
    assert out_of_scope_on_test(result, dev_labels, test_labels[:4]) == {}  # no out-of-scope query


def test_a_task_folder_with_out_of_scope_queries_reads_them_with_test_only(tmp_path):
    from openbook.data import load_kshot

    task = tmp_path / "intents"
    (task / "10-13").mkdir(parents=True)
    for name in ("10-13/train.csv", "10-13/dev.csv", "test.csv"):
        (task / name).write_text("0,book a flight\n1,set an alarm\n")
    (task / "oos_test.csv").write_text("-1,what is the meaning of life\n")
    splits = load_kshot(tmp_path, "intents", 13, 10)
    assert [e.text for e in splits.out_of_scope] == ["what is the meaning of life"]
    assert load_kshot(tmp_path, "intents", 13, 10, test=False).out_of_scope == []
    (task / "oos_test.csv").unlink()
    assert load_kshot(tmp_path, "intents", 13, 10).out_of_scope == []
