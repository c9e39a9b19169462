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

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch
from torch import nn

from openbook.prompting.encoder import Demo
from openbook.store import KnowledgeStore

DemoMode = Literal["neural", "words", "text"]
_HEAD_ROWS = 1024  # class vectors scored against the vocabulary at once: (1024, V) float32 logits


@dataclass(frozen=True)
class DemoConfig:
    m: int = 4  # neighbours per class: averaged into one vector (neural, words) or each written out (text)
    temperature: float = 0.1  # of the averaging weights (neural, words)
    mode: DemoMode = "neural"

    def __post_init__(self) -> None:
        if self.m < 1:
            raise ValueError(f"m must be at least 1, got {self.m}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.mode not in get_args(DemoMode):
            raise ValueError(f"mode must be one of {', '.join(get_args(DemoMode))}, got {self.mode!r}")


@dataclass(frozen=True)
class Demonstrations:
    vectors: np.ndarray  # (B, C, H) weighted mean of each class's neighbours (unit-norm slot space)
    ids: np.ndarray  # (B, C, m) neighbour ids, -1 where the class has fewer than m examples
    weights: np.ndarray  # (B, C, m) softmax weights, 0 where there is no neighbour
    similarities: np.ndarray  # (B, C, m)


def retrieve_demonstrations(
    store: KnowledgeStore,
    queries: np.ndarray,  # (B, H)
    num_labels: int,
    config: DemoConfig,
    *,
    exclude_ids: np.ndarray | None = None,
) -> Demonstrations:
    hits = store.search_per_label(queries, config.m, num_labels, exclude_ids=exclude_ids)  # (B, C, m)
    present = hits.ids >= 0
    logits = np.where(present, hits.similarities / config.temperature, -np.inf)
    logits = logits - np.max(np.where(present, logits, -np.inf), axis=-1, keepdims=True, initial=-1e30)
    weights = np.where(present, np.exp(logits), 0.0)
    weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-12)  # (B, C, m)
    neighbour_vectors = np.zeros((*hits.ids.shape, store.dim), dtype=np.float32)  # (B, C, m, H)
    if present.any():
        neighbour_vectors[present] = store.vectors_of(hits.ids[present])
    vectors = np.einsum("bcm,bcmh->bch", weights.astype(np.float32), neighbour_vectors)  # (B, C, H)
    return Demonstrations(vectors, hits.ids, weights.astype(np.float32), hits.similarities)


def to_input_space(
    vectors: np.ndarray, embedding_weight: torch.Tensor, embedding_scale: float
) -> torch.Tensor:
    """Map demonstration vectors (B, C, H) into the token-embedding distribution.

    Each query's class vectors are centred on their mean over the classes present, so what is left
    is what tells the classes apart; that direction is placed at the mean token embedding, at the
    typical distance of a token from it. Token embeddings are the table as the model reads it: the
    weights times `embedding_scale` (`Backbone.input_embedding_scale`; sqrt(hidden size) on Gemma 3).

    A class with no neighbour (its examples not in the store yet, as in a continual run's new stage)
    is placed at the mean token embedding: no evidence either way. An all-zero input row there made
    SmolLM2's weight gradients NaN while the loss stayed finite (continual SST-2 -> trec, RetroPrompt,
    first trec step), so the zero vector is not used as "nothing".
    """
    table = embedding_weight.detach().float()
    raw_mean = table.mean(0)  # (H,)
    token_mean = raw_mean * embedding_scale
    token_spread = (table - raw_mean).norm(dim=-1).mean() * embedding_scale
    demo = torch.from_numpy(vectors).to(table.device)  # (B, C, H)
    present = demo.norm(dim=-1, keepdim=True) > 0  # (B, C, 1)
    count = present.sum(1, keepdim=True).clamp(min=1)
    centre = (demo * present).sum(1, keepdim=True) / count  # (B, 1, H)
    offset = demo - centre
    direction = offset / offset.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    placed = token_mean + direction * token_spread
    return torch.where(present, placed, token_mean.expand_as(demo))  # (B, C, H)


def to_words(vectors: np.ndarray, head: nn.Linear, embedding_table: torch.Tensor) -> torch.Tensor:
    """Each class vector (B, C, H) read as a word: the input embedding of the token the LM head ranks first.

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
    demo = torch.from_numpy(vectors).to(weight.device)  # (B, C, H)
    flat = demo.reshape(-1, demo.shape[-1])  # (B*C, H)
    words = torch.empty(len(flat), dtype=torch.long, device=weight.device)
    for start in range(0, len(flat), _HEAD_ROWS):  # bounds the (rows, V) logits on large batches
        logits = flat[start : start + _HEAD_ROWS].to(weight.dtype) @ weight.T  # (rows, V)
        if bias is not None:
            logits = logits + bias.detach()
        words[start : start + _HEAD_ROWS] = logits.argmax(-1)
    placed = table[words.to(table.device)].float().reshape(*demo.shape[:-1], table.shape[-1])  # (B, C, E)
    present = (demo.norm(dim=-1, keepdim=True) > 0).to(table.device)  # (B, C, 1)
    return torch.where(present, placed, table.float().mean(0).expand_as(placed))


def retrieve_texts(
    store: KnowledgeStore,
    queries: np.ndarray,  # (B, H)
    num_labels: int,
    config: DemoConfig,
    *,
    exclude_ids: np.ndarray | None = None,
) -> list[list[Demo]]:
    """Per query, its textual demonstrations in prompt order: (text, label index) pairs.

    The m nearest neighbours of each class, ordered rank by rank (every class's nearest, then every
    class's second nearest, ...) and by label order within a rank, so the order is deterministic and the
    length budget (`PromptEncoder`, which drops demonstrations from the end) takes the farthest first.
    A class with fewer than m examples in the store shows what it has. `exclude_ids[b]` is never shown to
    row b (leave-one-out in training).
    """
    hits = store.search_per_label(queries, config.m, num_labels, exclude_ids=exclude_ids)  # (B, C, m)
    ordered = hits.ids.transpose(0, 2, 1).reshape(len(queries), -1)  # (B, m*C): rank-major
    classes = np.tile(np.arange(num_labels), config.m)  # (m*C,)
    found = ordered >= 0
    texts = iter(store.texts_of(ordered[found]))
    return [[(next(texts), int(c)) for c in classes[row]] for row in found]
