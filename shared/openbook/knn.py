"""kNN distribution over labels and its interpolation with the LM (RetroPrompt).

    P_kNN(y | x) = sum over the top-k neighbours n with label y of softmax_n(sim(x, n) / (T * s_x))
    P(y | x)     = lam * P_kNN(y | x) + (1 - lam) * P_LM(y | x)

`sim` is, by default (`similarity="centred"`), the cosine after subtracting the mean of the store's
keys from the key and from the query (0 with a single key stored), or the plain cosine of the unit
slot vectors (`"cosine"`, the default until a dev grid chose centring: docs/knn-selection.md).
`s_x` is 1, or with `standardise` the standard deviation of x's k similarities: a temperature set per
query by the spread of its neighbours (softmax over the similarities standardised per query, over T).

Both answer one measurement: a causal LM's slot vectors share one dominant direction. On
SmolLM2-135M the mean of SST-2's 32 training keys has norm 0.96, every key lies at cosine 0.96 to it,
and the keys' pairwise cosines sit at 0.92 +- 0.03; a dev sentence's 16 nearest keys span 0.04, so at
T = 0.1 their softmax weights differ by less than a factor 1.5 and P_kNN is little more than the
labels' share among them. Centred, the pairwise cosines spread to -0.03 +- 0.23.

The store is searched by raw cosine as it is (FAISS inner product or the torch backend), and the
centred cosine re-scores and re-ranks the `RERANK_WIDTH * k` nearest of that search: centring is a
correction on the neighbours that a search returns, not a second index.

The interpolation is done in probability space, exactly as written. A query with no neighbour
(empty store) falls back to P_LM alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from openbook.store import KnowledgeStore, SearchResult

Similarity = Literal["cosine", "centred"]
SIMILARITIES: tuple[Similarity, ...] = ("cosine", "centred")
# Centred: the raw-cosine candidates re-scored per neighbour kept. Centring moves a key's rank by how far
# its (and the query's) component along the mean direction differs from the others'.
RERANK_WIDTH = 4


@dataclass(frozen=True)
class KnnConfig:
    k: int = field(default=16, metadata={"help": "neighbours read per query"})
    temperature: float = field(default=0.1, metadata={"help": "T of the neighbours' softmax"})
    # None: chosen on the stored examples, each left out in turn, and kept level with the store by the
    # classifier (`lambda_on_store.py`: an untrained task's)
    lam: float | None = field(default=0.5, metadata={"help": "the weight of P_kNN in the interpolation"})
    similarity: Similarity = field(
        default="centred",
        metadata={
            "help": "how neighbours are scored: the cosine after subtracting the store's mean key, or plain"
        },
    )
    standardise: bool = field(
        default=False, metadata={"help": "divide T by the spread (std) of each query's k similarities"}
    )

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.lam is not None and not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {self.similarity!r}")
        if not isinstance(self.standardise, bool):
            raise ValueError(f"standardise must be true or false, got {self.standardise!r}")


DEFAULT_KNN = KnnConfig()


def centred_cosine(
    queries: npt.ArrayLike,  # (B, H) unit rows
    keys: npt.ArrayLike,  # (N, H) unit rows
    centre: npt.ArrayLike,  # (H,)
) -> np.ndarray:
    """(B, N) float32 cosine of (query - centre) and (key - centre); 0 where either is the centre."""
    q = np.asarray(queries, np.float64) - np.asarray(centre, np.float64)  # (B, H)
    v = np.asarray(keys, np.float64) - np.asarray(centre, np.float64)  # (N, H)
    norms = np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(v, axis=1)[None, :]  # (B, N)
    products = q @ v.T
    return np.divide(products, norms, out=np.zeros_like(products), where=norms > 0).astype(np.float32)


def knn_search(
    store: KnowledgeStore,
    queries: npt.ArrayLike,  # (B, H)
    k: int,
    similarity: Similarity,
    *,
    exclude_ids: npt.ArrayLike | None = None,
) -> SearchResult:
    """The k nearest stored examples of each query under `similarity`, most similar first.

    Centred: the store's raw-cosine search returns `RERANK_WIDTH * k` candidates (at most the store),
    which are re-scored with the centred cosine; the k best of them are kept.
    """
    if similarity == "cosine" or len(store) == 0:
        return store.search(queries, k, exclude_ids=exclude_ids)
    width = max(k, min(len(store), RERANK_WIDTH * k))
    hits = store.search(queries, width, exclude_ids=exclude_ids)  # validates the queries and k
    unit = np.asarray(queries, np.float64)
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    found = hits.ids >= 0
    candidates, column = np.unique(hits.ids[found], return_inverse=True)
    scored = centred_cosine(unit, store.vectors_of(candidates), store.key_mean())  # (B, U)
    similarities = np.full(hits.ids.shape, -np.inf, np.float32)  # (B, width)
    similarities[found] = scored[np.nonzero(found)[0], column]
    order = np.argsort(-similarities, axis=1, kind="stable")[:, :k]  # missing hits (-inf) sort last
    return SearchResult(
        ids=np.take_along_axis(hits.ids, order, axis=1),
        labels=np.take_along_axis(hits.labels, order, axis=1),
        similarities=np.take_along_axis(similarities, order, axis=1),
    )


def knn_distribution(
    similarities: torch.Tensor,  # (B, k); -inf where there is no neighbour
    labels: torch.Tensor,  # (B, k) long; -1 where there is no neighbour
    num_labels: int,
    temperature: float,
    standardise: bool = False,
) -> torch.Tensor:
    """(B, num_labels) P_kNN; an all-zero row where a query has no neighbour.

    `standardise`: each row's present similarities become (s - mean) / std first (a row whose
    neighbours are all equally similar weighs them equally).
    """
    present = labels >= 0
    if standardise:
        similarities = _standardised(similarities, present)
    logits = (similarities / temperature).masked_fill(~present, float("-inf"))
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row of only -inf gives NaN: no neighbours
    p_knn = torch.zeros(labels.shape[0], num_labels, dtype=weights.dtype, device=weights.device)
    return p_knn.scatter_add_(1, labels.clamp(min=0), weights)  # (B, C)


def _standardised(similarities: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """(B, k) per-row z-scores of the present similarities; 0 at absent ones."""
    kept = similarities.masked_fill(~present, 0.0)  # (B, k)
    count = present.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
    mean = kept.sum(-1, keepdim=True) / count
    deviation = (kept - mean).masked_fill(~present, 0.0)
    std = (deviation.square().sum(-1, keepdim=True) / count).sqrt()  # (B, 1)
    return torch.where(std > 0, deviation / std.clamp(min=torch.finfo(std.dtype).tiny), 0.0)


def knn_mixture(
    p_lm: np.ndarray,  # (B, C)
    similarities: np.ndarray,  # (B, >=k) neighbours, most similar first
    labels: np.ndarray,  # (B, >=k)
    config: KnnConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """(P_kNN, P) from the first `config.k` neighbours: the one path prediction and evaluation share.
    `config.lam` must be a number: a classifier that chooses it on its store resolves it first."""
    if config.lam is None:
        raise ValueError("lam is None (chosen on the store): resolve it first (Classifier.served_knn)")
    p_knn = knn_distribution(
        torch.from_numpy(similarities[:, : config.k]),
        torch.from_numpy(labels[:, : config.k]),
        p_lm.shape[1],
        config.temperature,
        config.standardise,
    )
    return p_knn.numpy(), interpolate(p_knn, torch.from_numpy(p_lm), config.lam).numpy()


def interpolate(p_knn: torch.Tensor, p_lm: torch.Tensor, lam: float) -> torch.Tensor:
    """lam * P_kNN + (1 - lam) * P_LM per row; rows without neighbours keep P_LM."""
    has_neighbours = p_knn.sum(-1, keepdim=True) > 0  # (B, 1)
    weight = torch.where(has_neighbours, lam, 0.0)
    return weight * p_knn + (1.0 - weight) * p_lm
