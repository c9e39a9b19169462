"""Label calibration (`calibration.py`): each mode's log-prior, and P_LM with it removed."""

from __future__ import annotations

import numpy as np
import pytest
from openbook.calibration import CONTENT_FREE_INPUTS, calibrated_p_lm, label_bias, mean_prediction_bias

SCORES = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], dtype=np.float32))  # (N, C)


def softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


class Scorer:
    """Stands in for the classifier's label scoring: records what it was asked to score."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return SCORES[: len(texts)]


def test_mean_prediction_bias_is_the_log_of_the_mean_probability() -> None:
    expected = np.log(softmax(SCORES.astype(np.float64)).mean(0))
    np.testing.assert_allclose(mean_prediction_bias(SCORES), expected, rtol=1e-6)
    # Scores need not be normalised: a constant per row does not change the prior.
    np.testing.assert_allclose(mean_prediction_bias(SCORES + np.float32(3.0)), expected, rtol=1e-5)


def test_calibrated_p_lm_is_the_softmax_of_the_scores_minus_the_bias() -> None:
    bias = np.log(np.array([0.6, 0.3, 0.1], dtype=np.float32))
    np.testing.assert_allclose(calibrated_p_lm(SCORES, bias), softmax(SCORES - bias), atol=1e-6)
    np.testing.assert_allclose(calibrated_p_lm(SCORES, None), softmax(SCORES), atol=1e-6)
    # Dividing out a prior that favours label 0 moves mass to the others.
    assert (calibrated_p_lm(SCORES, bias)[:, 0] < softmax(SCORES)[:, 0]).all()


def test_none_has_no_bias_and_scores_nothing() -> None:
    scorer = Scorer()
    assert label_bias("none", scorer, is_pair=False, domain_lm_log_probs=SCORES) is None
    assert scorer.calls == []


@pytest.mark.parametrize("is_pair", [False, True])
def test_content_free_scores_the_content_free_inputs(is_pair: bool) -> None:
    scorer = Scorer()
    bias = label_bias("content-free", scorer, is_pair=is_pair)
    expected_inputs = [(t, t) if is_pair else t for t in CONTENT_FREE_INPUTS]
    assert scorer.calls == [expected_inputs]
    np.testing.assert_allclose(bias, mean_prediction_bias(SCORES[: len(CONTENT_FREE_INPUTS)]))


def test_domain_uses_the_given_in_domain_scores_and_needs_them() -> None:
    scorer = Scorer()
    bias = label_bias("domain", scorer, is_pair=False, domain_lm_log_probs=SCORES[::-1].copy())
    np.testing.assert_allclose(bias, mean_prediction_bias(SCORES))  # the mean ignores row order
    assert scorer.calls == []
    with pytest.raises(ValueError, match="unlabelled in-domain texts"):
        label_bias("domain", scorer, is_pair=False)
