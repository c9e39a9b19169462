"""Prompt-based fine-tuning (LM-BFF; Gao et al., 2021): the baseline.

Every backbone weight but the token-embedding table (`freeze_embeddings`,
chosen on dev; `no-freeze-embeddings` trains it too) trains on the
cross-entropy of the label words at the slot, i.e. the classification head
is the LM head restricted to the verbalizer. Prediction is the prompt alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from openbook.classifier import Classifier
from openbook.methods.base import (
    EmbeddingOptions,
    FullFineTuning,
    Inference,
    MethodConfig,
    TrainBatch,
    calibrated_logits,
    prompt_cross_entropy,
    register_method,
)


@dataclass(frozen=True)
class PromptFTConfig(MethodConfig, EmbeddingOptions):
    pass


@register_method
class PromptFT(FullFineTuning):
    name = "prompt-ft"
    summary = "LM-BFF prompt-based fine-tuning: all weights but the token embeddings, label-word loss"
    # As wide as Method's: `lora` subclasses this method with a config class of its own.
    config_class: ClassVar[type[MethodConfig]] = PromptFTConfig

    @property
    def inference(self) -> Inference:
        return "zero-shot"

    def loss(self, classifier: Classifier, batch: TrainBatch) -> torch.Tensor:
        log_probs, _ = classifier.label_scores(batch.texts)
        return prompt_cross_entropy(calibrated_logits(classifier, log_probs), batch.gold).mean()
