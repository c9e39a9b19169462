"""The k-shot evaluation harness's own arithmetic: macro-F1 and the kNN-interpolation method.

The harness end to end runs through `openbook eval` in tests/cli/test_evaluate.py.
"""

import numpy as np
import pytest
from openbook.experiments.evaluation import MethodInputs, knn_interp, knn_interp_dev, macro_f1
from openbook.knn import KnnConfig
from openbook.selection import Evidence, Split
from openbook.store import SearchResult


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
    _, params = knn_interp(inputs)
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
    _, params = knn_interp(alone)
    assert params["lam"] == 0.0 and params["selected_on"] == "dev" and params["dev_accuracy"] == 1.0
    frozen = MethodInputs(2, p_dev, p_dev, dev, dev, store_size=32, train=Evidence(p_train, train))
    _, params = knn_interp(frozen)
    assert params["lam"] > 0.5 and params["selected_on"] == "train (leave-one-out) + dev"
    assert params["dev_accuracy"] == 0.0  # the chosen lambda, scored on dev alone
    _, params = knn_interp_dev(frozen)  # the earlier rule ignores them
    assert params["lam"] == 0.0 and params["selected_on"] == "dev"
