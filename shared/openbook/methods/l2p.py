"""L2P (Wang et al., "Learning to Prompt for Continual Learning", CVPR 2022): prompts picked per input.

Instead of one prompt shared by every input, L2P keeps a pool of M small
prompts, each paired with a learnable key. An input is first read by the
frozen model alone; that representation is the query. The N keys closest to
the query (cosine) choose which N prompts are prepended to the input, so
inputs that look alike share prompts while unrelated inputs (e.g. from a
later task) can use others: the prompts are instance-wise memory, and
nothing in the backbone changes, which is what limits forgetting.

Mapping onto OpenBook:

- the query is the slot vector of the plain prompt (no pool), computed
  without gradients from the embeddings the backbone hands the soft prompt;
  keys live in that slot space (hidden size H), prompts in the input-embedding
  space (E; E = H for most backbones);
- the chosen prompts are concatenated in rank order and prepended as N*L
  virtual tokens, before any tokenizer special token, for masked and causal
  backbones alike (`prepend_virtual_tokens` keeps slot and positions right);
- the loss is the label-word cross-entropy plus the paper's surrogate term
  that pulls each selected key toward its query,
  `pull_weight * sum_selected (1 - cos(query, key))`; keys get gradient only
  from this term, prompts only from the cross-entropy;
- diversified selection: the pool counts how often each key was chosen in
  training (a buffer, saved with the checkpoint). While training, keys are
  ranked by `(1 - cos) * (1 + frequency_penalty * f)`, with `f` each key's
  count at the end of the previous training run (the previous tasks, as in
  the paper) relative to the most used key: a key that served earlier tasks
  a lot gives way to a less used one of nearly the same cosine, so a new task
  tends to claim prompts of its own. Within one run the penalty is fixed: a
  penalty from the current run's own running count steered training away
  from the prompts inference picks (SST-2 seed 13: dev accuracy 69% after
  8 steps, against 81% without the penalty).
  The paper multiplies each distance by the frequency itself; the `1 + ...`
  form keeps an unused key at its plain distance instead of zero. Inference
  is plain top-N by cosine.

The backbone stays frozen; only keys and prompts train, at `prompt_lr`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from openbook.backbone import Backbone, PromptedInput
from openbook.classifier import Classifier
from openbook.methods.base import (
    Inference,
    Method,
    MethodConfig,
    MethodError,
    TrainBatch,
    calibrated_logits,
    prompt_cross_entropy,
    register_method,
)
from openbook.prompting import EncodedBatch
from openbook.soft_prompts import SoftPrompt, prepend_virtual_tokens

INIT_SEED = 0  # the pool's initial values; a checkpoint overwrites them


@dataclass(frozen=True)
class L2PConfig(MethodConfig):
    pool_size: int = 10  # M key -> prompt pairs (the paper's 10)
    top_n: int = 5  # N prompts chosen per input (the paper's 5)
    prompt_length: int = 5  # L virtual tokens per prompt (the paper's 5)
    pull_weight: float = 0.1  # lambda of the key-query surrogate loss
    frequency_penalty: float = 1.0  # 0: plain top-N in training too
    prompt_lr: float = 3e-3  # for keys and prompts (token embeddings here are ~0.1 a coordinate)

    def __post_init__(self) -> None:
        if min(self.pool_size, self.top_n, self.prompt_length) < 1:
            raise ValueError("pool-size, top-n and prompt-length must be at least 1")
        if self.pool_size < self.top_n:
            raise ValueError(
                f"the pool has {self.pool_size} prompts but top-n asks for {self.top_n} per input: "
                "pool-size must be at least top-n"
            )
        if self.pull_weight < 0 or self.frequency_penalty < 0:
            raise ValueError("pull-weight and frequency-penalty must be non-negative")
        if self.prompt_lr <= 0:
            raise ValueError(f"prompt-lr must be positive, got {self.prompt_lr}")


@dataclass
class Selection:
    query: torch.Tensor  # (B, H) unit-norm frozen slot vectors, no gradient
    indices: torch.Tensor  # (B, N) chosen keys, best first


def frozen_query(embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> torch.Tensor:
    """(B, H) unit slot vectors of the plain prompt: the frozen model's reading of the input, no pool."""
    kwargs = {"inputs_embeds": embeds, "attention_mask": batch.attention_mask, "output_hidden_states": True}
    if backbone.kind == "causal":
        kwargs.update(position_ids=batch.position_ids, use_cache=False)
    with torch.no_grad():
        # The base model (no LM head): the same hidden states the backbone's own forward reads.
        hidden_states = backbone.model.base_model(**kwargs).hidden_states
        rows = torch.arange(embeds.shape[0], device=embeds.device)
        slot = hidden_states[backbone.config.layer][rows, batch.slot_index]  # (B, H)
    return F.normalize(slot.float(), dim=-1)


class PromptPool(SoftPrompt):
    """M keys (M, H) and M prompts (M, L, E); prepends the N prompts whose keys best match the query."""

    counts: torch.Tensor  # buffers, registered in __init__
    previous_counts: torch.Tensor

    def __init__(
        self, config: L2PConfig, hidden_size: int, token_embeddings: torch.Tensor, embedding_scale: float
    ) -> None:
        super().__init__()
        self.top_n = config.top_n
        self.frequency_penalty = config.frequency_penalty
        generator = torch.Generator().manual_seed(INIT_SEED)
        # Uniform keys, as the paper initialises them; prompts start as real token embeddings (prompt
        # tuning's vocabulary initialisation), so the frozen LM first reads familiar inputs. The model
        # reads the table `token_embeddings` times `embedding_scale` (`Backbone.input_embedding_scale`).
        keys = torch.rand(config.pool_size, hidden_size, generator=generator) * 2 - 1  # (M, H)
        vocabulary = token_embeddings.detach().float().cpu()  # (V, E)
        tokens = torch.randint(len(vocabulary), (config.pool_size, config.prompt_length), generator=generator)
        device = token_embeddings.device
        self.keys = nn.Parameter(keys.to(device))
        self.prompts = nn.Parameter((vocabulary[tokens] * embedding_scale).to(device))  # (M, L, E)
        self.register_buffer("counts", torch.zeros(config.pool_size, device=device))  # (M,) selections
        # The counts when this training run began: what the penalty reads (not saved; see `close_task`).
        self.register_buffer("previous_counts", torch.zeros_like(self.counts), persistent=False)
        # What the latest forward chose: the backbone owns the forward call, so this is the only way the
        # surrogate loss can see the queries and keys of the pass it is added to.
        self.last_selection: Selection | None = None

    def select(self, query: torch.Tensor) -> torch.Tensor:
        """(B, H) unit queries -> (B, N) key indices; frequency-penalised in training mode."""
        cosine = query @ F.normalize(self.keys.detach(), dim=-1).T  # (B, M)
        if not (self.training and self.frequency_penalty > 0):
            return cosine.topk(self.top_n, dim=-1).indices
        frequency = self.previous_counts / self.previous_counts.max().clamp(min=1.0)  # (M,) in [0, 1]
        distance = (1 - cosine) * (1 + self.frequency_penalty * frequency)  # (B, M)
        return distance.topk(self.top_n, dim=-1, largest=False).indices

    def close_task(self) -> None:
        """Every selection counted so far now belongs to the previous tasks that the penalty discourages."""
        self.previous_counts.copy_(self.counts)

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        query = frozen_query(embeds, batch, backbone)  # (B, H)
        indices = self.select(query)  # (B, N)
        if self.training:
            with torch.no_grad():
                self.counts += torch.bincount(indices.flatten(), minlength=len(self.counts)).float()
        self.last_selection = Selection(query, indices)
        virtual = self.prompts[indices].flatten(1, 2)  # (B, N, L, E) -> (B, N*L, E)
        return prepend_virtual_tokens(embeds, batch, virtual)


def pull_loss(keys: torch.Tensor, selection: Selection) -> torch.Tensor:
    """(B,) sum over each row's selected keys of 1 - cos(query, key); differentiable in the keys."""
    chosen = F.normalize(keys[selection.indices], dim=-1)  # (B, N, H)
    cosine = (chosen * selection.query[:, None, :]).sum(-1)  # (B, N)
    return (1 - cosine).sum(-1)


@register_method
class L2P(Method):
    name = "l2p"
    summary = "L2P: a pool of key-prompt pairs, the best-matching prompts prepended; backbone frozen"
    config_class = L2PConfig
    config: L2PConfig
    updates_backbone = False

    @property
    def inference(self) -> Inference:
        return "zero-shot"

    def prepare(self, classifier: Classifier) -> Classifier:
        self.check_backbone(classifier.backbone)
        backbone = classifier.backbone
        table, scale = backbone.input_embeddings.weight, backbone.input_embedding_scale
        pool = PromptPool(self.config, backbone.hidden_size, table, scale)
        # Inference mode until the loop's training steps switch it: the untrained pool's calibration and
        # step-0 dev pass must neither count selections nor use the training-time penalty.
        return dataclasses.replace(classifier, prompt=pool.eval())

    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        pool = _pool(classifier)
        return [pool.keys, pool.prompts]

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict]:
        # The loop's `lr` is meant for backbone weights; none train here.
        return [{"params": self.trainable_parameters(classifier), "lr": self.config.prompt_lr}]

    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        return dict(_pool(classifier).state_dict())

    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        pool = _pool(classifier)
        try:
            pool.load_state_dict(tensors, strict=True)
        except RuntimeError as error:
            raise MethodError(
                f"checkpoint tensors do not fit this {self.spec} prompt pool: {error}"
            ) from None
        # Loaded weights were trained on earlier data: training from here on (the next task of a continual
        # sequence, `openbook train --init`) steers away from the prompts those tasks used most.
        pool.close_task()

    def loss(self, classifier: Classifier, batch: TrainBatch) -> torch.Tensor:
        pool = _pool(classifier)
        pool.last_selection = None
        log_probs, _ = classifier.label_scores(batch.texts)
        ce = prompt_cross_entropy(calibrated_logits(classifier, log_probs), batch.gold)  # (B,)
        assert pool.last_selection is not None  # set by the forward just run
        return (ce + self.config.pull_weight * pull_loss(pool.keys, pool.last_selection)).mean()


def _pool(classifier: Classifier) -> PromptPool:
    if not isinstance(classifier.prompt, PromptPool):
        raise MethodError("this classifier has no L2P prompt pool: call the method's prepare() first")
    return classifier.prompt
