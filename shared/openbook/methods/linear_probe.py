"""Linear probe: logistic regression on the frozen backbone's slot features.

The standard test of what a frozen representation already knows (as in
Alain and Bengio, "Understanding intermediate layers using linear classifier
probes", ICLR workshop 2017): the backbone and the prompt stay fixed, and a
linear layer plus softmax over the labels is fitted on the few-shot examples.
It is the baseline every prompt method must beat to show that the label words
and the LM head add something.

What it reads: the probe is a `SoftPrompt` that scores the labels itself, so
the backbone hands it the slot's LM-head input, unit-normalised here. For a
causal backbone (with the default last layer) that is exactly the unit slot
vector that the store keys on (`classifier.embed(...).vectors`): the final
normed hidden state. For a masked LM it is the MLM head's transform of that
state (dense + activation + LayerNorm), the features the label words are
scored from.

How it is fitted: with the shared loop (AdamW, the kept weights and
checkpoints as for every method), L2 regularisation as the group's
weight decay. A closed-form or L-BFGS fit would converge in one call, but it
would need its own path around the loop, the dev selection and the
checkpoints; with a few dozen examples and a zero-initialised layer the loop
reaches a good fit in a few dozen steps, and each step costs one frozen
forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods.base import register_method
from openbook.methods.soft_prompt_method import SoftPromptConfig, SoftPromptMethod
from openbook.soft_prompts import SoftPrompt, word_output_embedding


@dataclass(frozen=True)
class LinearProbeConfig(SoftPromptConfig):
    prompt_lr: float = 0.1
    l2: float = 1e-3  # AdamW's decoupled weight decay on the weights (not the bias)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.l2 < 0:
            raise ValueError(f"l2 must be non-negative, got {self.l2}")


class LinearProbeHead(SoftPrompt):
    """log softmax(W x / |x| + b) over the labels; leaves the prompt's input untouched."""

    scores_labels = True

    def __init__(self, features: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, num_labels)
        nn.init.zeros_(self.linear.weight)  # starts uniform: calibration and step 0 see no preference
        nn.init.zeros_(self.linear.bias)

    def label_logits(self, features: torch.Tensor) -> torch.Tensor:  # (B, H) -> (B, C)
        return F.log_softmax(self.linear(F.normalize(features, dim=-1)), dim=-1)

    def with_label(self, backbone: Backbone, word_ids: Sequence[int]) -> LinearProbeHead:
        """The new label's row is its word's LM-head row, which lives in the probe's feature space, scaled
        to the mean length of the rows trained so far, and its bias the mean of theirs: until the next
        training it scores the slot as the LM scores the word, no more sharply than a trained label.
        On an untrained (zero) probe it is zero too, and every label stays equally likely."""
        row, _ = word_output_embedding(backbone, word_ids)
        weight, bias = self.linear.weight.detach(), self.linear.bias.detach()  # (C, H), (C,)
        new_row = F.normalize(row.to(weight), dim=0) * weight.norm(dim=1).mean()  # (H,)
        grown = LinearProbeHead(weight.shape[1], weight.shape[0] + 1).to(weight)
        with torch.no_grad():
            grown.linear.weight.copy_(torch.cat([weight, new_row[None]]))
            grown.linear.bias.copy_(torch.cat([bias, bias.mean()[None]]))
        return grown.train(self.training)


@register_method
class LinearProbe(SoftPromptMethod):
    name = "linear-probe"
    summary = "logistic regression on the frozen slot features (LM-head input), no label words"
    config_class = LinearProbeConfig
    prompt_class = LinearProbeHead
    config: LinearProbeConfig

    def build_prompt(self, classifier: Classifier) -> SoftPrompt:
        head = classifier.backbone.model.get_output_embeddings()
        features = head.weight.shape[1]  # the LM head's input width: the hidden size, or ALBERT's smaller one
        return LinearProbeHead(features, len(classifier.labels))

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict[str, Any]]:
        probe = self.prompt_of(classifier)
        assert isinstance(probe, LinearProbeHead)  # prompt_of checks it is a prompt_class
        head = probe.linear
        return [
            {"params": [head.weight], "lr": self.config.prompt_lr, "weight_decay": self.config.l2},
            {"params": [head.bias], "lr": self.config.prompt_lr, "weight_decay": 0.0},
        ]
