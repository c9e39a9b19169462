"""Trainable prompts that act on a prompted batch's input embeddings.

DART, IPT, L2P and the PEFT baselines all train vectors that the backbone
reads as if they were tokens. A `SoftPrompt` is the `nn.Module` that holds
them: the backbone hands it the batch's input embeddings (after any
demonstrations were injected) and runs on what it returns. It may

- overwrite positions (DART's template pseudo-tokens),
- prepend virtual tokens (IPT, L2P, prompt tuning, P-tuning; see
  `prepend_virtual_tokens`, which keeps the slot, demonstration and padding
  bookkeeping right for masked and causal backbones),
- pass extra model inputs (prefix tuning's per-layer key/value prefix),
- and score the labels itself from the slot's pre-LM-head features (DART's
  differentiable label embeddings).

A prompt that scores the labels holds a row per label, so a label added to a
live classifier (`openbook.labels`) needs one more: `with_label` returns the
prompt for the grown label set. Every other prompt reads no label and serves
any label set as it is.

A classifier holds at most one soft prompt (`Classifier.prompt`); a method's
`prepare` builds it and `trained_tensors` / `load_trained` save and restore it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from openbook.backbone import Backbone, PromptedInput
from openbook.prompting import EncodedBatch


class SoftPrompt(nn.Module):
    """Base class: the identity prompt. Subclasses override `forward` and, optionally, `label_logits`."""

    scores_labels: bool = False  # True: `label_logits` replaces the LM head's label-word scores

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        return PromptedInput(embeds, batch)

    def label_logits(self, features: torch.Tensor) -> torch.Tensor:  # (B, H) -> (B, C)
        """Label scores from the slot's LM-head input features (only called when `scores_labels`)."""
        raise NotImplementedError

    def with_label(self, backbone: Backbone, word_ids: Sequence[int]) -> SoftPrompt:
        """This prompt for one more label, whose word the LM reads as `word_ids`; self is left as it was.

        A prompt that reads no label serves the grown set as it is; one that scores the labels must
        say how its new row starts, so it cannot inherit this.
        """
        if self.scores_labels:
            raise NotImplementedError(f"{type(self).__name__} scores the labels and cannot take another yet")
        return self


def word_output_embedding(
    backbone: Backbone, word_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A label word's row of the LM head, (E',), and its bias (None when the head has none): the means
    over the word's pieces, as the head would score the word at the slot."""
    head = backbone.model.get_output_embeddings()
    ids = torch.tensor(list(word_ids), device=backbone.device)
    with torch.no_grad():
        row = head.weight[ids].mean(0)
        bias = getattr(head, "bias", None)
        return row, None if bias is None else bias[ids].mean()


def prepend_virtual_tokens(embeds: torch.Tensor, batch: EncodedBatch, virtual: torch.Tensor) -> PromptedInput:
    """Put `virtual` (B, P, E) in front of every row: (B, T, E) -> (B, P + T, E).

    Every index (slot, demonstrations, template mask) shifts by P, the virtual
    tokens are attended to, and a causal batch's explicit positions continue
    after them (its left padding stays masked, so each row still reads
    virtual tokens, then its text, with contiguous positions).
    """
    num_virtual = virtual.shape[1]
    rows = embeds.shape[0]
    ones = batch.attention_mask.new_ones(rows, num_virtual)
    position_ids = None
    if batch.position_ids is not None:
        virtual_positions = torch.arange(num_virtual, device=embeds.device).expand(rows, num_virtual)
        position_ids = torch.cat([virtual_positions, batch.position_ids + num_virtual], dim=1)
    template_mask = None
    if batch.template_mask is not None:
        template_mask = torch.cat([batch.template_mask.new_zeros(rows, num_virtual), batch.template_mask], 1)
    shifted = dataclasses.replace(
        batch,
        input_ids=torch.cat([batch.input_ids.new_zeros(rows, num_virtual), batch.input_ids], 1),
        attention_mask=torch.cat([ones, batch.attention_mask], dim=1),
        position_ids=position_ids,
        slot_index=batch.slot_index + num_virtual,
        demo_index=None if batch.demo_index is None else batch.demo_index + num_virtual,
        template_mask=template_mask,
    )
    return PromptedInput(torch.cat([virtual.to(embeds.dtype), embeds], dim=1), shifted)


def text_mask(batch: EncodedBatch) -> torch.Tensor:
    """(B, T) bool: attended positions that are neither template, slot nor demonstration.

    That is the input text, plus the tokenizer's special tokens around it ([CLS], [SEP], <s>).
    """
    mask = batch.attention_mask.bool().clone()
    if batch.template_mask is not None:
        mask &= ~batch.template_mask
    rows = torch.arange(mask.shape[0], device=mask.device)
    mask[rows, batch.slot_index] = False
    if batch.demo_index is not None:
        mask[rows[:, None], batch.demo_index] = False
    return mask
