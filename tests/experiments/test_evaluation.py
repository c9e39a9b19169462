"""The k-shot evaluation harness's own arithmetic: macro-F1 and the kNN-interpolation method.

The harness end to end runs through `openbook eval` in tests/cli/test_evaluate.py.
"""

import numpy as np
import pytest
from openbook.experiments.evaluation import MethodInputs, knn_interp, macro_f1
from openbook.knn import KnnConfig
from openbook.selection import Split
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
