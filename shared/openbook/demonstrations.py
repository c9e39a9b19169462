"""Demonstrations: per class, the store's nearest neighbours of the input, shown to the LM.

Three ways to show them (`DemoConfig.mode`):

- `neural` (RetroPrompt): for each class c the top-m neighbours of that class
  are retrieved and their slot vectors averaged with softmax(similarity / T)
  weights. The result is placed in the input next to the embedding of c's
  label word (the placeholder positions laid out by `PromptEncoder`), so the
  LM reads one `[demo vector, label word]` pair per class.
- `words`: the same class vector, read as a word: the input embedding of the
  token the LM head ranks first for it, E[argmax v·Wᵀ] (`to_words`), in the
  same place.
- `text` (LM-BFF, Gao et al., ACL 2021): each class's m nearest neighbours
  written out, the template filled with the example and its label word
  (`retrieve_texts`; the layout and the length budget are `PromptEncoder`'s).

Many labels. Showing every class does not fit a prompt of a few hundred
tokens once a task has dozens of labels (150 intents' pairs alone take about
450 tokens on Gemma 3's tokenizer). A row then shows its `DemoConfig.classes`
nearest classes only: the most probable under the query's P_kNN (`knn.py`, the
distribution the prediction interpolates), ties, such as the classes no
neighbour votes for, broken by each class's nearest example, then by label
order (`nearest_classes`). They are shown in label order. The label words
are still scored for every class; only the demonstrations are limited. The
default, 16, is the default kNN's k: every class P_kNN can put weight on is
shown, and a task of at most 16 labels shows all of them, as before.

Mapping into the input space. Store vectors are unit-norm slot states from
the model's top layer, while the input layer expects token embeddings. The
paper injects the representations as they are. Here that failed: a causal
LM's slot states share one dominant direction (mean pairwise cosine 0.92 on
SST-2 train), so raw demonstrations were near-identical, out-of-distribution
inputs, and on SST-2 dev (seed 13) training with them drove accuracy from 75%
to 56-59%. We therefore centre each query's class vectors on their mean over
the classes (keeping what tells the classes apart) and place that direction at
the mean token embedding, at a token's typical distance from it; with this
mapping the same run trained to 81% dev (see docs/experiments/demonstrations-dev-probes.md).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch
from torch import nn

from openbook.prompting.encoder import Demo, DemoLayout
from openbook.store import KnowledgeStore, SearchResult

DemoMode = Literal["neural", "words", "text"]
_HEAD_ROWS = 1024  # class vectors scored against the vocabulary at once: (1024, V) float32 logits
# The most classes a row shows: the default kNN's k (knn.KnnConfig), so every class P_kNN can weigh is shown.
DEFAULT_DEMO_CLASSES = 16


@dataclass(frozen=True)
class DemoConfig:
    m: int = 4  # neighbours per class: averaged into one vector (neural, words) or each written out (text)
    temperature: float = 0.1  # of the averaging weights (neural, words)
    mode: DemoMode = "neural"
    classes: int = DEFAULT_DEMO_CLASSES  # the most classes a row shows: its nearest by P_kNN

    @property
    def layout(self) -> DemoLayout:
        """How `PromptEncoder` lays the demonstrations out: written out (text), or a vector per class."""
        return "text" if self.mode == "text" else "vectors"

    def __post_init__(self) -> None:
        if self.m < 1:
            raise ValueError(f"m must be at least 1, got {self.m}")
        if self.classes < 1:
            raise ValueError(f"classes must be at least 1, got {self.classes}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.mode not in get_args(DemoMode):
            raise ValueError(f"mode must be one of {', '.join(get_args(DemoMode))}, got {self.mode!r}")


@dataclass(frozen=True)
class Demonstrations:
    """Per row, one class vector for each class shown (K of them: every class, or the nearest)."""

    vectors: np.ndarray  # (B, K, H) weighted mean of each class's neighbours (unit-norm slot space)
    ids: np.ndarray  # (B, K, m) neighbour ids, -1 where the class has fewer than m examples
    weights: np.ndarray  # (B, K, m) softmax weights, 0 where there is no neighbour
    similarities: np.ndarray  # (B, K, m)
    classes: np.ndarray  # (B, K) the label index of each class vector, in label order


def nearest_classes(p_knn: np.ndarray, nearest: np.ndarray, count: int) -> np.ndarray:
    """(B, count) the classes each row shows, in label order: the `count` most probable under P_kNN
    (B, C), ties broken by the class's nearest example's similarity (B, C; -inf where it has none), then
    by label order."""
    order = np.lexsort((-nearest, -p_knn), axis=-1)  # stable: equal keys keep label order
    return np.sort(order[:, :count], axis=-1)


def _classes_shown(
    hits: SearchResult, num_labels: int, shown: int | None, p_knn: np.ndarray | None
) -> np.ndarray:
    """(B, K) the classes each row shows: every class when `shown` covers them, else `nearest_classes`."""
    rows = len(hits.ids)
    if shown is None or shown >= num_labels:
        return np.broadcast_to(np.arange(num_labels), (rows, num_labels))
    if p_knn is None or p_knn.shape != (rows, num_labels):
        raise ValueError(f"showing {shown} of {num_labels} classes needs each query's P_kNN, (B, C)")
    return nearest_classes(p_knn, hits.similarities[:, :, 0], shown)


def retrieve_demonstrations(
    store: KnowledgeStore,
    queries: np.ndarray,  # (B, H)
    num_labels: int,
    config: DemoConfig,
    *,
    exclude_ids: np.ndarray | None = None,
    shown: int | None = None,  # classes a row shows; None: every class
    p_knn: np.ndarray | None = None,  # (B, C) each query's P_kNN, which ranks the classes when not all show
) -> Demonstrations:
    """Per query, the class vector of each class shown (`nearest_classes` when fewer than all)."""
    every = store.search_per_label(queries, config.m, num_labels, exclude_ids=exclude_ids)  # (B, C, m)
    classes = _classes_shown(every, num_labels, shown, p_knn)  # (B, K)
    hits = _of_classes(every, classes)  # (B, K, m)
    present = hits.ids >= 0
    logits = np.where(present, hits.similarities / config.temperature, -np.inf)
    logits = logits - np.max(np.where(present, logits, -np.inf), axis=-1, keepdims=True, initial=-1e30)
    weights = np.where(present, np.exp(logits), 0.0)
    weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-12)  # (B, K, m)
    neighbour_vectors = np.zeros((*hits.ids.shape, store.dim), dtype=np.float32)  # (B, K, m, H)
    if present.any():
        neighbour_vectors[present] = store.vectors_of(hits.ids[present])
    vectors = np.einsum("bcm,bcmh->bch", weights.astype(np.float32), neighbour_vectors)  # (B, K, H)
    return Demonstrations(vectors, hits.ids, weights.astype(np.float32), hits.similarities, classes)


def _of_classes(hits: SearchResult, classes: np.ndarray) -> SearchResult:
    """Per-label hits (B, C, m) narrowed to each row's `classes` (B, K): (B, K, m)."""
    if classes.shape[1] == hits.ids.shape[1]:
        return hits  # every class, in label order
    at = classes[:, :, None]
    return SearchResult(
        *(np.take_along_axis(a, at, axis=1) for a in (hits.ids, hits.labels, hits.similarities))
    )


# Tables whose statistics `token_statistics` holds, by id: a few, as a service holds a few backbones.
_STATISTICS: dict[int, tuple[weakref.ref, tuple, tuple[torch.Tensor, torch.Tensor]]] = {}
_STATISTICS_KEPT = 4
_STATISTICS_LOCK = threading.Lock()  # a service's forwards run in worker threads
_STATISTICS_ROWS = 65536  # table rows centred at once: bounds the float32 temporary (Gemma 3: 262k rows)


def token_statistics(
    embedding_weight: torch.Tensor, embedding_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean token embedding (E,) and a token's mean distance from it (a scalar), as the model reads them.

    On Gemma 3 the table is 262k x 640, and computing these took about a second of one CPU thread with
    a float32 copy of the table beside it: once per forward with demonstrations, every training step
    and every classify. They are kept while the table is unchanged: the same tensor, storage, dtype and
    version counter (an optimiser step and `load_state_dict` write in place and bump the counter; a
    dtype change replaces the storage). A write through `.data` bumps nothing: the code base makes none
    to an embedding table. An inference tensor has no version counter: its statistics are not kept.
    """
    if embedding_weight.is_inference():
        return _statistics_of(embedding_weight, embedding_scale)
    key = (
        embedding_weight.data_ptr(),
        embedding_weight._version,
        embedding_weight.dtype,
        embedding_weight.device,
        embedding_scale,
    )
    with _STATISTICS_LOCK:
        kept = _STATISTICS.get(id(embedding_weight))
        if kept is not None and kept[0]() is embedding_weight and kept[1] == key:
            return kept[2]
        statistics = _statistics_of(embedding_weight, embedding_scale)
        _STATISTICS.pop(id(embedding_weight), None)
        if len(_STATISTICS) >= _STATISTICS_KEPT:
            _STATISTICS.pop(next(iter(_STATISTICS)))
        _STATISTICS[id(embedding_weight)] = (weakref.ref(embedding_weight), key, statistics)
        return statistics


def _statistics_of(
    embedding_weight: torch.Tensor, embedding_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    table = embedding_weight.detach()
    raw_mean = sum(rows.float().sum(0) for rows in table.split(_STATISTICS_ROWS)) / len(table)  # (E,)
    spread = sum(
        (rows.float() - raw_mean).norm(dim=-1).sum() for rows in table.split(_STATISTICS_ROWS)
    ) / len(table)
    return raw_mean * embedding_scale, spread * embedding_scale


def to_input_space(
    vectors: np.ndarray, embedding_weight: torch.Tensor, embedding_scale: float
) -> torch.Tensor:
    """Map demonstration vectors (B, K, H) into the token-embedding distribution.

    Each query's class vectors are centred on their mean over the classes shown and present, so what is left
    is what tells the classes apart; that direction is placed at the mean token embedding, at the
    typical distance of a token from it. Token embeddings are the table as the model reads it: the
    weights times `embedding_scale` (`Backbone.input_embedding_scale`; sqrt(hidden size) on Gemma 3).

    A class with no neighbour (its examples not in the store yet, as in a continual run's new stage)
    is placed at the mean token embedding: no evidence either way. An all-zero input row there made
    SmolLM2's weight gradients NaN while the loss stayed finite (continual SST-2 -> trec, RetroPrompt,
    first trec step), so the zero vector is not used as "nothing".
    """
    token_mean, token_spread = token_statistics(embedding_weight, embedding_scale)
    demo = torch.from_numpy(vectors).to(token_mean.device)  # (B, K, H)
    present = demo.norm(dim=-1, keepdim=True) > 0  # (B, K, 1)
    count = present.sum(1, keepdim=True).clamp(min=1)
    centre = (demo * present).sum(1, keepdim=True) / count  # (B, 1, H)
    offset = demo - centre
    direction = offset / offset.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    placed = token_mean + direction * token_spread
    return torch.where(present, placed, token_mean.expand_as(demo))  # (B, K, H)


def to_words(vectors: np.ndarray, head: nn.Linear, embedding_table: torch.Tensor) -> torch.Tensor:
    """Each class vector (B, K, H) read as a word: the input embedding of the token the LM head ranks first.

    The word is argmax over the vocabulary of v·Wᵀ (+ the head's bias), W the output head's rows, and the
    result is that token's row of the input table: a real token embedding, so the untrained model reads a
    word it knows. On the step-0 probe (docs/experiments/demonstrations-dev-probes.md) this lost the least
    of the mappings tried, and unlike the sharpened expected embedding softmax(8·s·v·Wᵀ)·E it has no scale
    to choose. The vector is the slot state as stored; for a masked LM whose head transforms the state
    before its output rows (BERT's dense + LayerNorm), that transform is skipped. A class with no
    neighbour is placed at the mean token embedding, as in `to_input_space`.
    """
    table = embedding_table.detach()
    weight = head.weight.detach()  # (V, H)
    bias = getattr(head, "bias", None)
    demo = torch.from_numpy(vectors).to(weight.device)  # (B, K, H)
    flat = demo.reshape(-1, demo.shape[-1])  # (B*C, H)
    words = torch.empty(len(flat), dtype=torch.long, device=weight.device)
    for start in range(0, len(flat), _HEAD_ROWS):  # bounds the (rows, V) logits on large batches
        logits = flat[start : start + _HEAD_ROWS].to(weight.dtype) @ weight.T  # (rows, V)
        if bias is not None:
            logits = logits + bias.detach()
        words[start : start + _HEAD_ROWS] = logits.argmax(-1)
    placed = table[words.to(table.device)].float().reshape(*demo.shape[:-1], table.shape[-1])  # (B, K, E)
    present = (demo.norm(dim=-1, keepdim=True) > 0).to(table.device)  # (B, K, 1)
    raw_mean = token_statistics(embedding_table, 1.0)[0].to(table.device)  # the caller applies the scale
    return torch.where(present, placed, raw_mean.expand_as(placed))


def retrieve_texts(
    store: KnowledgeStore,
    queries: np.ndarray,  # (B, H)
    num_labels: int,
    config: DemoConfig,
    *,
    exclude_ids: np.ndarray | None = None,
    shown: int | None = None,  # classes a row shows; None: every class
    p_knn: np.ndarray | None = None,  # (B, C) each query's P_kNN, which ranks the classes when not all show
) -> list[list[Demo]]:
    """Per query, its textual demonstrations in prompt order: (text, label index) pairs.

    The m nearest neighbours of each class shown (`nearest_classes` when fewer than all), ordered rank
    by rank (every class's nearest, then every class's second nearest, ...) and by label order within a
    rank, so the order is deterministic and the length budget (`PromptEncoder`, which drops
    demonstrations from the end) takes the farthest first. A class with fewer than m examples in the
    store shows what it has. `exclude_ids[b]` is never shown to row b (leave-one-out in training).
    """
    every = store.search_per_label(queries, config.m, num_labels, exclude_ids=exclude_ids)  # (B, C, m)
    classes = _classes_shown(every, num_labels, shown, p_knn)  # (B, K)
    hits = _of_classes(every, classes)  # (B, K, m)
    ordered = hits.ids.transpose(0, 2, 1).reshape(len(queries), -1)  # (B, m*K): rank-major
    labels = np.tile(classes, config.m)  # (B, m*K)
    found = ordered >= 0
    texts = iter(store.texts_of(ordered[found]))
    return [
        [(next(texts), int(c)) for c in row_labels[row]]
        for row_labels, row in zip(labels, found, strict=True)
    ]
