"""kNN distribution over labels and its interpolation with the LM (RetroPrompt).

    P_kNN(y | x) = sum over the top-k neighbours n with label y of softmax_n(sim(x, n) / T)
    P(y | x)     = lam * P_kNN(y | x) + (1 - lam) * P_LM(y | x)

The interpolation is done in probability space, exactly as written. A query
with no neighbour (empty store) falls back to P_LM alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class KnnConfig:
    k: int = 16
    temperature: float = 0.1
    lam: float = 0.5  # weight of P_kNN in the interpolation

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


def knn_distribution(
    similarities: torch.Tensor,  # (B, k); -inf where there is no neighbour
    labels: torch.Tensor,  # (B, k) long; -1 where there is no neighbour
    num_labels: int,
    temperature: float,
) -> torch.Tensor:
    """(B, num_labels) P_kNN; an all-zero row where a query has no neighbour."""
    present = labels >= 0
    logits = (similarities / temperature).masked_fill(~present, float("-inf"))
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row of only -inf gives NaN: no neighbours
    p_knn = torch.zeros(labels.shape[0], num_labels, dtype=weights.dtype, device=weights.device)
    return p_knn.scatter_add_(1, labels.clamp(min=0), weights)  # (B, C)


def knn_mixture(
    p_lm: np.ndarray,  # (B, C)
    similarities: np.ndarray,  # (B, >=k) neighbours, most similar first
    labels: np.ndarray,  # (B, >=k)
    config: KnnConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """(P_kNN, P) from the first `config.k` neighbours: the one path prediction and evaluation share."""
    p_knn = knn_distribution(
        torch.from_numpy(similarities[:, : config.k]),
        torch.from_numpy(labels[:, : config.k]),
        p_lm.shape[1],
        config.temperature,
    )
    return p_knn.numpy(), interpolate(p_knn, torch.from_numpy(p_lm), config.lam).numpy()


def interpolate(p_knn: torch.Tensor, p_lm: torch.Tensor, lam: float) -> torch.Tensor:
    """lam * P_kNN + (1 - lam) * P_LM per row; rows without neighbours keep P_LM."""
    has_neighbours = p_knn.sum(-1, keepdim=True) > 0  # (B, 1)
    weight = torch.where(has_neighbours, lam, 0.0)
    return weight * p_knn + (1.0 - weight) * p_lm
