"""What a classifier hands out: its embeddings of texts (`Embeddings`, `SlotVectors`), the scores read
from them (`Scores`) and its predictions, with the neighbours behind them (`Prediction`, `Neighbour`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from openbook.store import SearchResult


@dataclass(frozen=True)
class Neighbour:
    id: int
    label: str
    similarity: float  # as the kNN scored it (KnnConfig.similarity: cosine, or centred cosine)


@dataclass(frozen=True)
class Prediction:
    label: str
    probabilities: dict[str, float]
    p_lm: dict[str, float]
    p_knn: dict[str, float] | None  # None when the store had nothing to offer
    neighbours: tuple[Neighbour, ...]
    truncated: bool  # the input was cut to fit the backbone's max_length
    # its nearest stored example is less similar than the classifier's `min_similarity` (out_of_scope.py)
    out_of_scope: bool = False


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # (N, H) unit-norm slot representations (store keys / kNN queries)
    lm_log_probs: np.ndarray  # (N, C) log P(label word | prompt), uncalibrated
    truncated: np.ndarray  # (N,) bool
    reader_vectors: np.ndarray | None = (
        None  # (N, H') the sentence reader's unit embeddings, where it has one
    )


@dataclass(frozen=True)
class SlotVectors:
    """The slot vectors alone, without label scores: what a store key needs (`Classifier.embed_vectors`)."""

    vectors: np.ndarray  # (N, H) unit-norm slot representations
    truncated: np.ndarray  # (N,) bool


@dataclass(frozen=True)
class Scores:
    p_lm: np.ndarray  # (N, C)
    p_knn: np.ndarray  # (N, C); all-zero rows where no neighbour was found
    probabilities: np.ndarray  # (N, C)
    hits: SearchResult | None
