"""RetroPrompt's own parts: the kNN-guided loss weights and the demonstrations' backbone check.

Its training and checkpoint round trip run beside prompt-ft's in tests/test_training.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.methods.retroprompt import RetroPromptConfig, knn_guided_weights
from openbook.store import KnowledgeStore


def test_knn_guided_weights_are_leave_one_out() -> None:
    store = KnowledgeStore(2)
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    store.add(np.arange(3), vectors, np.array([0, 1, 1]))
    gold = torch.tensor([0, 1])
    config = RetroPromptConfig(k=2, temperature=0.1, min_p_knn=1e-6, beta=1.0)
    weights = knn_guided_weights(store, vectors[:2], np.array([0, 1]), gold, 2, config)
    # Example 0 is the only label-0 item: without itself its neighbours are all label 1, so p_kNN(gold) is
    # tiny and the weight large. Example 1 still has example 2 (same vector, label 1) as a neighbour.
    assert weights[0] > 10.0
    assert weights[1] < 1.5


def test_demonstrations_refuse_a_backbone_whose_embeddings_are_not_the_slot_size(
    albert_dir: Path, fresh_classifier
) -> None:
    with pytest.raises(ValueError, match="no-demos"):
        fresh_classifier(albert_dir, "retroprompt")
    classifier, _ = fresh_classifier(albert_dir, "retroprompt/no-demos")
    assert classifier.demos is None
