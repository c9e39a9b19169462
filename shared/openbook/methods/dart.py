"""DART (Zhang et al., "Differentiable Prompt Makes Pre-trained Language Models Better Few-shot
Learners", ICLR 2022): the prompt itself becomes trainable.

A hand-written prompt fixes two things in discrete vocabulary space: the
template's words and the label words. DART frees both and trains them by
gradient together with the whole backbone:

- differentiable template: every token the template contributes ("It was",
  "Sentiment:") is replaced by a trainable pseudo-token vector, one per
  template position, initialised from the embedding of the word it replaces,
  so training starts from the hand-written prompt and may drift away from it;
- differentiable labels: each class gets a trainable vector in the LM head's
  output space, initialised from its label word's output embedding (the mean
  over the word's pieces), and the slot scores the classes with
  log_softmax_C(features . labels^T + bias), the LM head restricted to these
  C vectors (with the head's own bias, when it has one, as a trainable (C,));
- fluency constraint: free vectors could drift to places the language model
  cannot read, so an auxiliary language-modelling loss keeps the prompt
  fluent and makes the text's likelihood depend on the class. One random
  text token per example is hidden and predicted with a class vector put in
  the slot; a binary cross-entropy pushes P(original token) up when that
  class is the gold one and down when it is another:

      L = L_C + fluency_weight * L_F.

  The paper's code draws one random class per example. Here every class is
  scored and the BCE averaged (the same expectation): the extra pass is C
  times wider, but its gradient is less noisy, which matters in the
  short runs OpenBook trains (32 steps, early stopping after 2 dev checks).
  On SST-2's dev split (seed 13, smollm2-135m, 32 steps) the sampled form
  stopped at step 16 with nothing better than the untrained prompt (84.4%),
  sampled with fluency_weight=0.1 reached 90.6%, and this form with the
  paper's weight 1 reached 93.8%.

Masked and causal backbones. On a masked LM the fluency pass is the paper's:
the chosen token's input becomes [MASK], the slot's input becomes the class
vector, and the MLM head predicts the token at its own position. A causal LM
has no [MASK], and its slot is the last position, so a class vector written
there would be seen by no text token. The fluency pass therefore puts the
class vector in front of the row (a virtual first token) and asks for the
chosen text token as the next token of its left context: P(x_j | class, x<j),
a class-conditional language model over the prompted text. Nothing needs
masking, since a causal position never sees its own next token. The class
vector is an output embedding used as an input; with tied embeddings (BERT,
SmolLM2) that is exactly DART's shared label token, and a backbone whose
output embeddings have another width than its inputs takes `dart/no-fluency`.

DART needs template tokens to learn: a template made only of placeholders
(e.g. "{text}{mask}") raises MethodError. Inference is the prompt alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from openbook.backbone import Backbone, PromptedInput
from openbook.classifier import Classifier
from openbook.methods.base import (
    FullFineTuning,
    Inference,
    MethodConfig,
    MethodError,
    TrainBatch,
    calibrated_logits,
    prompt_cross_entropy,
    register_method,
)
from openbook.prompting import EncodedBatch, TextInput
from openbook.soft_prompts import SoftPrompt, prepend_virtual_tokens, text_mask, word_output_embedding

PROMPT_PREFIX = "dart."  # checkpoint names of the prompt's tensors, beside the backbone's own names


@dataclass(frozen=True)
class DartConfig(MethodConfig):
    prompt_lr: float = 1e-3  # pseudo-tokens and label vectors (not tuned on dev); the backbone: the loop's lr
    fluency: bool = True
    fluency_weight: float = 1.0  # lambda_F; the paper's code adds the two losses unweighted

    def __post_init__(self) -> None:
        if self.prompt_lr <= 0:
            raise ValueError(f"prompt_lr must be positive, got {self.prompt_lr}")
        if self.fluency_weight < 0:
            raise ValueError(f"fluency_weight must be non-negative, got {self.fluency_weight}")


class DifferentiablePrompt(SoftPrompt):
    """Trainable template pseudo-tokens (written over the template's positions) and label vectors."""

    scores_labels = True

    def __init__(
        self,
        template: torch.Tensor,  # (P, E) initial pseudo-tokens
        labels: torch.Tensor,  # (C, E') initial label vectors, E' = the LM head's input width
        label_bias: torch.Tensor | None,  # (C,) initial bias, None when the head has none
    ) -> None:
        super().__init__()
        self.template = nn.Parameter(template.detach().clone())
        self.labels = nn.Parameter(labels.detach().clone())
        self.label_bias = None if label_bias is None else nn.Parameter(label_bias.detach().clone())

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        if batch.template_mask is None:
            raise ValueError("dart needs the batch's template mask to find the template's tokens")
        rows, width = embeds.shape[0], embeds.shape[-1]
        count = self.template.shape[0]
        if not bool((batch.template_mask.sum(1) == count).all()):
            raise ValueError(
                f"dart learned {count} template tokens, but this batch's rows hold another count"
            )
        # Row-major order: row b's k-th template position takes pseudo-token k, the same for every row.
        source = self.template.to(embeds.dtype).expand(rows, count, width)  # (B, P, E)
        return PromptedInput(embeds.masked_scatter(batch.template_mask[..., None], source), batch)

    def label_logits(self, features: torch.Tensor) -> torch.Tensor:  # (B, E') -> (B, C)
        logits = features @ self.labels.T  # (B, C)
        if self.label_bias is not None:
            logits = logits + self.label_bias
        return F.log_softmax(logits, dim=-1)

    def with_label(self, backbone: Backbone, word_ids: Sequence[int]) -> DifferentiablePrompt:
        """The new label's vector starts where DART starts every label: its word's output embedding."""
        row, bias = word_output_embedding(backbone, word_ids)
        labels = torch.cat([self.labels.detach(), row[None].to(self.labels)])  # (C + 1, E')
        label_bias = None
        if self.label_bias is not None:
            assert bias is not None  # the same head that gave the first labels theirs
            label_bias = torch.cat([self.label_bias.detach(), bias[None].to(self.label_bias)])  # (C + 1,)
        return DifferentiablePrompt(self.template, labels, label_bias).train(self.training)


def build_prompt(classifier: Classifier) -> DifferentiablePrompt:
    """The pseudo-tokens start as the template's word embeddings, the label vectors as the label words'."""
    backbone = classifier.backbone
    probe: TextInput = ("x", "x") if classifier.template.is_pair else "x"
    batch = classifier.encoder.encode([probe])  # template tokens do not depend on the text
    assert batch.template_mask is not None
    template_ids = batch.input_ids[0][batch.template_mask[0]]  # (P,)
    if len(template_ids) == 0:
        raise MethodError(
            f"dart learns the template's own tokens, and {classifier.template.source!r} has none: "
            "put some words around the placeholders, e.g. '{text} It was {mask}'"
        )
    with torch.no_grad():
        template = backbone.input_embeddings(template_ids.to(backbone.device))  # (P, E) as the model reads
    rows = [word_output_embedding(backbone, ids) for ids in classifier.encoder.label_token_ids]
    labels = torch.stack([row for row, _ in rows])  # (C, E')
    biases = [bias for _, bias in rows]
    label_bias = None if biases[0] is None else torch.stack(biases)  # type: ignore[arg-type]  # (C,)
    # float32 whatever the backbone's dtype, as the other prompts: `label_logits` reads float32 features
    return DifferentiablePrompt(template, labels, label_bias).to(backbone.device, torch.float32)


def fluency_loss(classifier: Classifier, texts: Sequence[TextInput], gold: torch.Tensor) -> torch.Tensor:
    """L_F: mean over rows and classes of the BCE of P(hidden text token | class in the slot), toward 1
    for the gold class and 0 for the others."""
    backbone, prompt = classifier.backbone, classifier.prompt
    assert isinstance(prompt, DifferentiablePrompt)
    device = backbone.device
    batch = classifier.encoder.encode(texts).to(device)
    gold = gold.to(device)
    embeds = prompt(backbone.input_embeddings(batch.input_ids), batch, backbone).embeds  # (B, T, E)
    rows, length, width = embeds.shape
    classes = len(prompt.labels)
    chosen, counted = choose_text_tokens(batch, backbone)  # (B,), (B,)
    # The label vectors live in the LM head's space; read as inputs they take the embedding module's
    # scale, as a tied head's row does when its token is in the input.
    label_vectors = prompt.labels.to(embeds.dtype) * backbone.input_embedding_scale  # (C, E)
    per_class = embeds[:, None].expand(rows, classes, length, width)  # (B, C, T, E): row b, class c

    if backbone.kind == "masked":
        positions = torch.arange(length, device=device)
        at_slot = (positions == batch.slot_index[:, None])[:, None, :, None]  # (B, 1, T, 1)
        at_chosen = (positions == chosen[:, None])[:, None, :, None]  # (B, 1, T, 1)
        mask_id = torch.tensor(backbone.tokenizer.mask_token_id, device=device)
        mask_vector = backbone.input_embeddings(mask_id)  # (E,)
        inputs = torch.where(at_slot, label_vectors[None, :, None, :], per_class)
        inputs = torch.where(at_chosen, mask_vector, inputs)  # (B, C, T, E)
        kwargs: dict[str, Any] = {
            "inputs_embeds": inputs.reshape(rows * classes, length, width),
            "attention_mask": batch.attention_mask.repeat_interleave(classes, 0),
        }
    else:
        # The class vector becomes the row's first token; after that one-position shift, position
        # `chosen` is the one whose next token is the chosen text token.
        virtual = label_vectors.repeat(rows, 1)[:, None]  # (B*C, 1, E): row b*C + c holds class c
        flat = per_class.reshape(rows * classes, length, width)  # (B*C, T, E)
        prompted = prepend_virtual_tokens(flat, _repeat_rows(batch, classes), virtual)  # (B*C, 1 + T, E)
        kwargs = {
            "inputs_embeds": prompted.embeds,
            "attention_mask": prompted.batch.attention_mask,
            "position_ids": prompted.batch.position_ids,
            "use_cache": False,
        }
    read = (torch.arange(rows * classes, device=device), chosen.repeat_interleave(classes))

    # Run the LM head on the B*C read positions only, not on all T of them (a 49k-word vocabulary
    # over every position would cost more than the rest of the pass).
    def only_read_positions(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        return (args[0][read][:, None],)  # (B*C, 1, E')

    hook = backbone.model.get_output_embeddings().register_forward_pre_hook(only_read_positions)
    try:
        logits = backbone.model(**kwargs).logits[:, 0].float()  # (B*C, V)
    finally:
        hook.remove()
    targets = batch.input_ids[torch.arange(rows, device=device), chosen]  # (B,)
    log_p = F.log_softmax(logits, dim=-1).gather(1, targets.repeat_interleave(classes)[:, None])
    log_p = log_p.view(rows, classes).clamp(max=-1e-6)  # (B, C); log(1 - p) stays finite
    is_gold = F.one_hot(gold, classes).bool()  # (B, C)
    bce = torch.where(is_gold, -log_p, -torch.log(-torch.expm1(log_p)))  # (B, C)
    weights = counted.float()[:, None]  # (B, 1); a row with no plain text token has no term
    return (bce * weights).sum() / (weights.sum() * classes).clamp(min=1.0)


def choose_text_tokens(batch: EncodedBatch, backbone: Backbone) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) one uniformly random input-text position per row (no template, slot or special token), and
    (B,) whether the row had one at all."""
    special = torch.tensor(backbone.tokenizer.all_special_ids, device=batch.input_ids.device)
    candidates = text_mask(batch) & ~torch.isin(batch.input_ids, special)  # (B, T)
    noise = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, -1.0)
    return noise.argmax(1), candidates.any(1)


def _repeat_rows(batch: EncodedBatch, times: int) -> EncodedBatch:
    """Each row `times` times in a row: row b becomes rows b*times .. b*times + times - 1."""

    def repeat(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor.repeat_interleave(times, 0)

    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids.repeat_interleave(times, 0),
        attention_mask=batch.attention_mask.repeat_interleave(times, 0),
        position_ids=repeat(batch.position_ids),
        slot_index=batch.slot_index.repeat_interleave(times, 0),
        demo_index=repeat(batch.demo_index),
        truncated=batch.truncated.repeat_interleave(times, 0),
        template_mask=repeat(batch.template_mask),
    )


@register_method
class Dart(FullFineTuning):
    name = "dart"
    summary = "DART: trainable template pseudo-tokens and label vectors, full fine-tuning, fluency objective"
    config_class = DartConfig
    config: DartConfig

    @property
    def inference(self) -> Inference:
        return "zero-shot"

    def check_backbone(self, backbone: Backbone) -> None:
        head = backbone.model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None:
            raise MethodError(
                "dart scores the labels with the LM head's output embeddings; this model has none"
            )
        embedding_dim = backbone.input_embeddings.embedding_dim
        if self.config.fluency and head.weight.shape[1] != embedding_dim:
            raise MethodError(
                f"dart's fluency objective puts label vectors ({head.weight.shape[1]}-d output embeddings) "
                f"into the input ({embedding_dim}-d); this backbone's sizes differ: use dart/no-fluency"
            )

    def prepare(self, classifier: Classifier) -> Classifier:
        self.check_backbone(classifier.backbone)
        return dataclasses.replace(classifier, prompt=build_prompt(classifier))

    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        return super().trainable_parameters(classifier) + list(self._prompt(classifier).parameters())

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict[str, Any]]:
        return [
            {"params": super().trainable_parameters(classifier), "lr": lr},
            {"params": list(self._prompt(classifier).parameters()), "lr": self.config.prompt_lr},
        ]

    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        prompt = {PROMPT_PREFIX + k: v for k, v in self._prompt(classifier).state_dict().items()}
        return super().trained_tensors(classifier) | prompt

    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        prompt = {k.removeprefix(PROMPT_PREFIX): v for k, v in tensors.items() if k.startswith(PROMPT_PREFIX)}
        super().load_trained(
            classifier, {k: v for k, v in tensors.items() if not k.startswith(PROMPT_PREFIX)}
        )
        try:
            self._prompt(classifier).load_state_dict(prompt, strict=True)
        except RuntimeError as error:
            raise MethodError(
                f"checkpoint's dart prompt does not fit this template and labels: {error}"
            ) from None

    def loss(self, classifier: Classifier, batch: TrainBatch) -> torch.Tensor:
        log_probs, _ = classifier.label_scores(batch.texts)
        loss = prompt_cross_entropy(calibrated_logits(classifier, log_probs), batch.gold).mean()
        if self.config.fluency and self.config.fluency_weight > 0:
            loss = loss + self.config.fluency_weight * fluency_loss(classifier, batch.texts, batch.gold)
        return loss

    @staticmethod
    def _prompt(classifier: Classifier) -> DifferentiablePrompt:
        if not isinstance(classifier.prompt, DifferentiablePrompt):
            raise MethodError("this classifier was not prepared by dart (call method.prepare first)")
        return classifier.prompt
