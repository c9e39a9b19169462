import numpy as np
import pytest
import torch
from openbook.knn import KnnConfig, interpolate, knn_distribution


def _reference_knn(similarities, labels, num_labels, temperature):
    out = np.zeros((len(labels), num_labels))
    for row in range(len(labels)):
        keep = labels[row] >= 0
        if not keep.any():
            continue
        logits = similarities[row][keep] / temperature
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        for label, weight in zip(labels[row][keep], weights, strict=True):
            out[row, label] += weight
    return out


def test_knn_distribution_matches_loop_reference():
    rng = np.random.default_rng(0)
    similarities = rng.uniform(-1, 1, size=(7, 5)).astype(np.float32)
    labels = rng.integers(0, 3, size=(7, 5))
    labels[2, 3:] = -1  # fewer neighbours than k
    similarities[2, 3:] = -np.inf
    labels[4] = -1  # no neighbours at all
    similarities[4] = -np.inf
    got = knn_distribution(torch.from_numpy(similarities), torch.from_numpy(labels), 3, 0.1).numpy()
    np.testing.assert_allclose(got, _reference_knn(similarities, labels, 3, 0.1), atol=1e-6)
    np.testing.assert_allclose(got[[0, 1, 2, 3, 5, 6]].sum(-1), 1.0, atol=1e-6)
    assert got[4].sum() == 0


def test_low_temperature_approaches_nearest_neighbour_vote():
    similarities = torch.tensor([[0.9, 0.8, 0.1]])
    labels = torch.tensor([[1, 0, 0]])
    sharp = knn_distribution(similarities, labels, 2, 0.001)
    flat = knn_distribution(similarities, labels, 2, 100.0)
    assert sharp[0, 1] > 0.99
    assert flat[0, 0] == pytest.approx(2 / 3, abs=1e-3)


def test_interpolation_is_the_linear_mixture_in_probability_space():
    p_knn = torch.tensor([[0.9, 0.1], [0.0, 0.0]])
    p_lm = torch.tensor([[0.2, 0.8], [0.3, 0.7]])
    mixed = interpolate(p_knn, p_lm, 0.25)
    torch.testing.assert_close(mixed[0], 0.25 * p_knn[0] + 0.75 * p_lm[0])
    torch.testing.assert_close(mixed[1], p_lm[1])  # no neighbours: P_LM alone, still a distribution
    torch.testing.assert_close(mixed.sum(-1), torch.ones(2))


@pytest.mark.parametrize("kwargs", [{"k": 0}, {"temperature": 0.0}, {"lam": 1.5}])
def test_knn_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        KnnConfig(**kwargs)
