"""The supervised contrastive loss (Khosla et al., NeurIPS 2020), in the two forms OpenBook trains with:
against the open book, on the slot space (`store_contrastive_loss`), and within a batch, on a sentence
encoder's embeddings (`supervised_contrastive_loss`, with `class_balanced_batches`: sentence_reader.py).
Both are one computation (`_supcon`): anchors against candidates, the anchor itself never its own.

On the slot space, against the open book.

Jian, Gao and Vosoughi (NAACL 2022, "Contrastive Learning for Prompt-Based Few-Shot Language Learners")
add SupCon (Khosla et al., NeurIPS 2020) over the slot's representation to prompt-based fine-tuning.
In OpenBook the slot vectors are the store's keys, so the loss is read against the store:

    L(i) = -1/|P(i)| * sum_{p in P(i)} log( exp(s(i, p) / T) / sum_{a in A(i)} exp(s(i, a) / T) )

where the anchor i is a training example's slot vector (with gradient), A(i) every stored key but its
own, P(i) those of its label, s the cosine similarity and T the temperature. The keys come from the
last re-embedding and carry no gradient, as in a memory bank.

Why against the store rather than in the batch: with many labels (150 intents) and a batch of 8, a
batch seldom holds two examples of one label, and an in-batch loss would have nothing to pull
together; the store holds every label's examples. And what it shapes is what kNN reads: after
training, the store is re-embedded with the same weights, so neighbours of one label move closer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from openbook.store import KnowledgeStore


def store_contrastive_loss(
    anchors: torch.Tensor,  # (B, H) slot vectors, differentiable, any norm
    anchor_ids: np.ndarray,  # (B,) the anchors' own ids in `store`, never their own candidates
    gold: torch.Tensor,  # (B,) label indices
    store: KnowledgeStore,
    temperature: float,
) -> torch.Tensor:
    """The mean of L(i) over the anchors that have at least one positive in the store; a zero that
    keeps the graph when none has (a label seen once, the anchor its only example)."""
    if len(store) < 2:  # no candidate besides the anchor itself
        return anchors.sum() * 0.0
    ids = store.ids()
    keys = torch.from_numpy(store.vectors_of(ids)).to(anchors.device, torch.float32)  # (N, H)
    key_labels = torch.from_numpy(store.labels()).to(gold.device)  # (N,)
    own = torch.from_numpy(anchor_ids[:, None] == ids[None, :]).to(anchors.device)  # (B, N)
    return _supcon(anchors, gold, keys, key_labels, own, temperature)


def _supcon(
    anchors: torch.Tensor,  # (B, H), any norm
    anchor_labels: torch.Tensor,  # (B,)
    candidates: torch.Tensor,  # (N, H), any norm
    candidate_labels: torch.Tensor,  # (N,)
    own: torch.Tensor,  # (B, N) bool: the candidate is the anchor itself
    temperature: float,
) -> torch.Tensor:
    """The mean over the anchors with a positive of -1/|P(i)| sum_p log softmax_a(s(i, a) / T)[p], by cosine
    s; a zero that keeps the graph when no anchor has a positive."""
    similarities = (
        F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T / temperature
    )
    similarities = similarities.masked_fill(own, float("-inf"))  # (B, N)
    log_probs = similarities - torch.logsumexp(similarities, dim=1, keepdim=True)  # (B, N)
    positive = (anchor_labels[:, None] == candidate_labels[None, :]) & ~own  # (B, N)
    counts = positive.sum(1)  # (B,)
    has_positive = counts > 0
    if not bool(has_positive.any()):
        return anchors.sum() * 0.0
    per_anchor = -log_probs.masked_fill(~positive, 0.0).sum(1) / counts.clamp(min=1)  # (B,)
    return per_anchor[has_positive].mean()


def supervised_contrastive_loss(
    embeddings: torch.Tensor,  # (B, H), any norm: compared by cosine
    labels: torch.Tensor,  # (B,) label indices
    temperature: float,
) -> torch.Tensor:
    """The batch-wise supervised contrastive loss (Khosla et al. 2020, L_out, their eq. 2):

        L = 1/|I'| * sum_{i in I'} -1/|P(i)| * sum_{p in P(i)} log q(i, p),
        q(i, p) = exp(s(i, p) / T) / sum_{a in A(i)} exp(s(i, a) / T)

    where A(i) is the batch without i, P(i) the members of A(i) with i's label, I' the anchors with at
    least one positive, s the cosine similarity and T the temperature. A zero that keeps the graph
    when no anchor has a positive."""
    own = torch.eye(len(labels), dtype=torch.bool, device=embeddings.device)  # (B, B)
    return _supcon(embeddings, labels, embeddings, labels, own, temperature)


def class_balanced_batches(
    labels: np.ndarray, batch_size: int, steps: int, seed: int
) -> Iterator[np.ndarray]:
    """`steps` batches of indices into `labels`: each takes min(classes, batch_size // 2) classes and
    batch_size // that many examples of each (fewer where a class has fewer), so that an anchor has a
    positive whatever the number of labels. Classes, and each class's examples, are drawn in seeded
    shuffled passes, so that all are seen about equally often."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per_batch = min(len(classes), max(1, batch_size // 2))
    take = batch_size // per_batch
    members_of = {label: np.flatnonzero(labels == label) for label in classes.tolist()}
    class_order = _shuffled_passes(classes, rng)
    members = {label: _shuffled_passes(indices, rng) for label, indices in members_of.items()}
    for _ in range(steps):
        chosen = _distinct(class_order, per_batch)
        yield np.concatenate([_distinct(members[c], min(take, len(members_of[c]))) for c in chosen])


def _shuffled_passes(items: np.ndarray, rng: np.random.Generator) -> Iterator[Any]:
    while True:
        yield from rng.permutation(items).tolist()


def _distinct(stream: Iterator[Any], count: int) -> list[Any]:
    """The next `count` distinct items of `stream` (a pass's end may repeat one just drawn: skipped)."""
    drawn: list[Any] = []
    while len(drawn) < count:
        item = next(stream)
        if item not in drawn:
            drawn.append(item)
    return drawn
