"""Label calibration: remove the LM's prior preference for some label words.

A small LM may prefer " great" over " terrible" whatever the input. Both
estimates below give a per-label log-prior b, and P_LM(y | x) becomes
softmax(score(x) - b):

- content-free (Zhao et al., 2021, "Calibrate Before Use"): the mean
  prediction on inputs that carry no content ("N/A", "[MASK]");
- domain: the mean prediction over unlabelled in-domain texts (e.g. the
  training texts, their labels unused).

The final distribution's confidence is calibrated apart, after the kNN
interpolation: temperature scaling, P_T = softmax(log P / T) (`with_temperature`;
fitted on dev in `quality.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch

from openbook.prompting import TextInput

CalibrationMode = Literal["none", "content-free", "domain"]
CALIBRATION_MODES: tuple[CalibrationMode, ...] = ("none", "content-free", "domain")
CONTENT_FREE_INPUTS = ("N/A", "[MASK]")


def mean_prediction_bias(lm_log_probs: np.ndarray) -> np.ndarray:
    """log of the mean P_LM over a set of inputs: (N, C) label scores -> (C,) log-prior."""
    probabilities = torch.softmax(torch.from_numpy(lm_log_probs).double(), dim=-1)
    return torch.log(probabilities.mean(0)).float().numpy()


def calibrated_p_lm(lm_log_probs: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """P_LM = softmax(score - b): (N, C) label scores and an optional (C,) log-prior -> (N, C)."""
    scores = torch.from_numpy(lm_log_probs)
    if bias is not None:
        scores = scores - torch.from_numpy(bias)
    return torch.softmax(scores, dim=-1).numpy()


def with_temperature(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(log P / T) per row: (N, C) -> (N, C), the same argmax; T = 1 leaves P as it is."""
    if temperature == 1.0:
        return probabilities
    logits = torch.log(torch.from_numpy(probabilities).double().clamp_min(1e-12)) / temperature
    return torch.softmax(logits, dim=-1).to(torch.from_numpy(probabilities).dtype).numpy()


def content_free_texts(is_pair: bool) -> list[TextInput]:
    return [(t, t) if is_pair else t for t in CONTENT_FREE_INPUTS]


def label_bias(
    mode: CalibrationMode,
    lm_log_probs_of: Callable[[Sequence[TextInput]], np.ndarray],
    is_pair: bool,
    domain_lm_log_probs: np.ndarray | None = None,
) -> np.ndarray | None:
    """The (C,) log-prior of `mode`; `lm_log_probs_of` scores the content-free inputs when it needs them."""
    if mode == "none":
        return None
    if mode == "content-free":
        return mean_prediction_bias(lm_log_probs_of(content_free_texts(is_pair)))
    if domain_lm_log_probs is None:
        raise ValueError("domain calibration needs the label scores of some unlabelled in-domain texts")
    return mean_prediction_bias(domain_lm_log_probs)
