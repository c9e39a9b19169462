"""What every method that trains only a soft prompt shares: the backbone stays frozen.

Prompt tuning, prefix tuning, P-tuning and the linear probe differ only in the
`SoftPrompt` they build (`build_prompt`); training it, saving it and loading it
back are the same. The prompt's parameters get their own learning rate
(`prompt_lr`, an option of each method, e.g. `prompt-tuning/prompt-lr=0.03`):
prompt vectors want a rate orders of magnitude above full fine-tuning's,
so the loop's `--lr` does not apply to them.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods.base import (
    Inference,
    Method,
    MethodConfig,
    MethodError,
    TrainBatch,
    calibrated_logits,
    prompt_cross_entropy,
)
from openbook.soft_prompts import SoftPrompt


@dataclass(frozen=True)
class SoftPromptConfig(MethodConfig):
    prompt_lr: float = 1e-2  # each method sets its own default, chosen on dev

    def __post_init__(self) -> None:
        if not self.prompt_lr > 0:
            raise ValueError(f"prompt_lr must be positive, got {self.prompt_lr}")


class SoftPromptMethod(Method):
    """A frozen backbone plus one trainable `SoftPrompt`; cross-entropy over the label scores."""

    config: SoftPromptConfig
    updates_backbone = False
    prompt_class: type[SoftPrompt] = SoftPrompt  # what `build_prompt` returns; checked before training

    @abstractmethod
    def build_prompt(self, classifier: Classifier) -> SoftPrompt:
        """A fresh prompt module for this classifier's backbone, template and labels."""

    @property
    def inference(self) -> Inference:
        return "zero-shot"

    def prepare(self, classifier: Classifier) -> Classifier:
        self.check_backbone(classifier.backbone)
        prompt = self.build_prompt(classifier).to(classifier.backbone.device)
        return dataclasses.replace(classifier, prompt=prompt)

    def prompt_of(self, classifier: Classifier) -> SoftPrompt:
        if not isinstance(classifier.prompt, self.prompt_class):
            raise MethodError(f"{self.name}: this classifier has no {self.prompt_class.__name__}: prepare it")
        return classifier.prompt

    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        return list(self.prompt_of(classifier).parameters())

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict[str, Any]]:
        return [{"params": self.trainable_parameters(classifier), "lr": self.config.prompt_lr}]

    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        return dict(self.prompt_of(classifier).state_dict())

    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        prompt = self.prompt_of(classifier)
        try:
            prompt.load_state_dict(tensors, strict=True)
        except RuntimeError as error:  # missing or unexpected names, other shapes
            message = f"{self.name}: the saved prompt does not fit this classifier: {error}"
            raise MethodError(message) from None

    def loss(self, classifier: Classifier, batch: TrainBatch) -> torch.Tensor:
        log_probs, _ = classifier.label_scores(batch.texts)
        return prompt_cross_entropy(calibrated_logits(classifier, log_probs), batch.gold).mean()


def check_room_for_virtual_tokens(method: str, backbone: Backbone, num_virtual_tokens: int) -> None:
    """Virtual tokens take positions too: the longest prompt plus them must fit the position table."""
    limit = getattr(backbone.model.config, "max_position_embeddings", None)
    if limit is not None and backbone.config.max_length + num_virtual_tokens > limit:
        raise MethodError(
            f"{method}: max_length {backbone.config.max_length} + {num_virtual_tokens} virtual tokens "
            f"exceeds this backbone's {limit} positions; lower --max-length or num-virtual-tokens"
        )
