"""A supervised contrastive loss on the slot space, taken against the open book.

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
    similarities = F.normalize(anchors.float(), dim=-1) @ F.normalize(keys, dim=-1).T / temperature  # (B, N)
    own = torch.from_numpy(anchor_ids[:, None] == ids[None, :]).to(anchors.device)  # (B, N)
    similarities = similarities.masked_fill(own, float("-inf"))
    log_probs = similarities - torch.logsumexp(similarities, dim=1, keepdim=True)  # (B, N)
    positive = (gold[:, None] == key_labels[None, :]) & ~own  # (B, N)
    counts = positive.sum(1)  # (B,)
    per_anchor = -log_probs.masked_fill(~positive, 0.0).sum(1) / counts.clamp(min=1)  # (B,)
    has_positive = counts > 0
    if not bool(has_positive.any()):
        return anchors.sum() * 0.0
    return per_anchor[has_positive].mean()
