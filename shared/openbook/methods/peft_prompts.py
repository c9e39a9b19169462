"""The PEFT baselines: prompt tuning, prefix tuning and P-tuning on a frozen backbone.

- Prompt tuning (Lester, Al-Rfou and Constant, "The Power of Scale for
  Parameter-Efficient Prompt Tuning", EMNLP 2021): P free vectors are read as
  tokens in front of every prompt, and only they train. Lester et al. found
  initialising them from real token embeddings (the class labels) far better
  than random vectors, so `init=labels` (the default) starts from the
  verbalizer's label-word embeddings, repeated to fill P.
- Prefix tuning (Li and Liang, "Prefix-Tuning: Optimizing Continuous Prompts
  for Generation", ACL 2021): instead of input vectors, every layer gets P
  trainable key/value pairs that all tokens attend to, as if a prefix had
  already been run through the model. Li and Liang initialise them with the
  activations of real words; `init=labels` does that: the prefix starts as the
  key/value cache of the label words (cycled to P tokens) run through the
  frozen model, so before training the backbone reads exactly "label words,
  then the prompt" (tested against writing those words into the template).
- P-tuning (Liu et al., "GPT Understands, Too", AI Open 2023): the virtual
  tokens are the output of a small encoder (an MLP or a bidirectional LSTM)
  over free embeddings, which couples them and eases optimisation. Liu et al.
  interleave them with anchor tokens of the template; here, as in the `peft`
  library, they are prepended.

The `peft` library builds every trainable tensor (`PromptEmbedding`,
`PrefixEncoder`, `PromptEncoder`), but the model is not wrapped with
`get_peft_model`: a `SoftPrompt` (see `soft_prompts.py`) calls the encoder and
hands its output to the backbone. So the backbone's state_dict keeps its names
(checkpoints verify the base weights by them) and the same prompt works on
masked and causal backbones.

Prefix tuning passes a fresh transformers `DynamicCache` of shape
(B, kv_heads, P, head_dim) per layer as `past_key_values` (a model appends the
batch's own keys to the cache it is given, so it cannot be reused). Its
attention mask then covers prefix + tokens, while the slot and demonstration
indices stay in token space (hidden states only exist for the tokens). The
tokens' positions continue after the prefix: a causal batch's explicit
positions are shifted by P, and a masked model offsets them by the cache
length itself. A backbone whose attention ignores `past_key_values` is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from openbook.backbone import Backbone, PromptedInput
from openbook.classifier import Classifier
from openbook.methods.base import MethodError, register_method
from openbook.methods.soft_prompt_method import (
    SoftPromptConfig,
    SoftPromptMethod,
    check_room_for_virtual_tokens,
)
from openbook.prompting import EncodedBatch
from openbook.soft_prompts import SoftPrompt, prepend_virtual_tokens

INIT_SEED = 0  # random initialisations do not depend on the caller's RNG state


@dataclass(frozen=True)
class PeftPromptConfig(SoftPromptConfig):
    INITS: ClassVar[tuple[str, ...]] = ("labels", "text", "random")

    num_virtual_tokens: int = 10
    init: str = "labels"  # labels: the label words; text: `init_text`; random: peft's own init
    init_text: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_virtual_tokens < 1:
            raise ValueError(f"num_virtual_tokens must be at least 1, got {self.num_virtual_tokens}")
        if self.init not in self.INITS:
            raise ValueError(f"init must be one of {', '.join(self.INITS)}; got {self.init!r}")
        if (self.init == "text") != bool(self.init_text.strip()):
            raise ValueError("init=text needs a non-empty init-text, and init-text needs init=text")


@dataclass(frozen=True)
class PromptTuningConfig(PeftPromptConfig):
    INITS = ("labels", "text", "vocab", "random")  # vocab: embeddings of random vocabulary tokens

    prompt_lr: float = 1e-2


@dataclass(frozen=True)
class PrefixTuningConfig(PeftPromptConfig):
    prompt_lr: float = 1e-2
    projection: bool = False  # Li and Liang's reparameterisation: an MLP produces the prefix

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.projection and self.init != "random":
            raise ValueError(
                "prefix-tuning/projection cannot start from real activations (an MLP's output cannot be "
                "set to them): add init=random"
            )


@dataclass(frozen=True)
class PTuningConfig(SoftPromptConfig):
    prompt_lr: float = 1e-3
    num_virtual_tokens: int = 10
    encoder: Literal["mlp", "lstm"] = "mlp"
    encoder_hidden_size: int = 0  # 0: the backbone's embedding size

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_virtual_tokens < 1 or self.encoder_hidden_size < 0:
            raise ValueError("num_virtual_tokens must be at least 1 and encoder_hidden_size non-negative")
        if self.encoder not in ("mlp", "lstm"):
            raise ValueError(f"encoder must be mlp or lstm, got {self.encoder!r}")


class VirtualTokens(SoftPrompt):
    """Prompt tuning and P-tuning: the encoder's P vectors go in front of every prompt."""

    def __init__(self, encoder: nn.Module, num_virtual_tokens: int) -> None:
        super().__init__()
        self.encoder = encoder  # peft PromptEmbedding or PromptEncoder: (1, P) indices -> (1, P, E)
        self.register_buffer("indices", torch.arange(num_virtual_tokens)[None], persistent=False)

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        virtual = self.encoder(self.indices)  # (1, P, E)
        return prepend_virtual_tokens(embeds, batch, virtual.expand(len(embeds), -1, -1))  # (B, P + T, E)


@dataclass(frozen=True)
class CacheShape:
    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, model_config: Any) -> CacheShape:
        heads = model_config.num_attention_heads
        kv_heads = getattr(model_config, "num_key_value_heads", None) or heads  # grouped-query attention
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
        return cls(model_config.num_hidden_layers, kv_heads, head_dim)


class KeyValuePrefix(SoftPrompt):
    """Prefix tuning: P trainable keys and values per layer, fed to the model as a KV cache."""

    indices: torch.Tensor  # (1, P) a buffer, registered in __init__

    def __init__(self, encoder: nn.Module, num_virtual_tokens: int, shape: CacheShape) -> None:
        super().__init__()
        self.encoder = encoder  # peft PrefixEncoder: (1, P) -> (1, P, layers * 2 * kv_heads * head_dim)
        self.shape = shape
        self.register_buffer("indices", torch.arange(num_virtual_tokens)[None], persistent=False)

    def forward(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput:
        from transformers import DynamicCache

        rows, p, s = len(embeds), self.indices.shape[1], self.shape
        flat = self.encoder(self.indices)[0].to(embeds.dtype)  # (P, L * 2 * K * D), peft's layout
        kv = flat.view(p, s.layers, 2, s.kv_heads, s.head_dim).permute(1, 2, 3, 0, 4)  # (L, 2, K, P, D)
        kv = kv[:, :, None].expand(-1, -1, rows, -1, -1, -1)  # (L, 2, B, K, P, D)
        cache = DynamicCache([(keys, values) for keys, values in kv], config=backbone.model.config)
        mask = torch.cat([batch.attention_mask.new_ones(rows, p), batch.attention_mask], 1)  # (B, P + T)
        positions = None if batch.position_ids is None else batch.position_ids + p  # (B, T)
        prefixed = dataclasses.replace(batch, attention_mask=mask, position_ids=positions)
        return PromptedInput(embeds, prefixed, {"past_key_values": cache})


def init_token_ids(classifier: Classifier, init: str, init_text: str, count: int) -> torch.Tensor:
    """(count,) token ids to start from: the label words' (as the LM scores them) or `init_text`'s, cycled."""
    if init == "labels":
        ids = [token for word in classifier.encoder.label_token_ids for token in word]
    else:
        ids = classifier.backbone.tokenizer(init_text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise MethodError(f"init text {init_text!r} has no tokens")
    repeated = (ids * -(-count // len(ids)))[:count]
    return torch.tensor(repeated, device=classifier.backbone.device)


def real_activations(backbone: Backbone, token_ids: torch.Tensor) -> torch.Tensor:
    """(P, L * 2 * K * D): the key/value cache of `token_ids` run through the model, in peft's flat layout."""
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin

    cache = DynamicCache(config=backbone.model.config)
    with torch.no_grad():
        backbone.model(input_ids=token_ids[None], past_key_values=cache, use_cache=True)
    layers = []
    for layer in cache.layers:
        # An attention layer, which the pass above filled (check_prefix_cache has run on this backbone).
        assert isinstance(layer, CacheLayerMixin) and layer.keys is not None and layer.values is not None
        layers.append(torch.stack([layer.keys[0], layer.values[0]]))
    kv = torch.stack(layers)  # (L, 2, K, P, D)
    return kv.permute(3, 0, 1, 2, 4).reshape(len(token_ids), -1)  # (P, L * 2 * K * D)


def check_prefix_cache(method: str, backbone: Backbone) -> None:
    """Run one token behind a one-token prefix: a model that reads `past_key_values` grows the cache."""
    from transformers import DynamicCache

    model = backbone.model
    try:
        s = CacheShape.of(model.config)
        blank = torch.zeros(1, s.kv_heads, 1, s.head_dim, device=backbone.device, dtype=backbone.dtype)
        cache = DynamicCache([(blank, blank)] * s.layers, config=model.config)
        token = torch.zeros(1, 1, dtype=torch.long, device=backbone.device)
        mask = torch.ones(1, 2, dtype=torch.long, device=backbone.device)  # prefix + token
        with torch.no_grad():
            model(input_ids=token, attention_mask=mask, past_key_values=cache)
        read = cache.get_seq_length() == 2
    except (AttributeError, TypeError, ValueError, RuntimeError, IndexError):
        read = False
    if not read:
        raise MethodError(
            f"{method} feeds each layer a key/value prefix through past_key_values, and this backbone "
            f"({type(model).__name__}) does not take one: use prompt-tuning or p-tuning"
        )


@register_method
class PromptTuning(SoftPromptMethod):
    name = "prompt-tuning"
    summary = "prompt tuning (Lester et al.): trainable virtual tokens before the prompt (peft)"
    config_class = PromptTuningConfig
    prompt_class = VirtualTokens
    config: PromptTuningConfig

    def check_backbone(self, backbone: Backbone) -> None:
        check_room_for_virtual_tokens(self.name, backbone, self.config.num_virtual_tokens)

    def build_prompt(self, classifier: Classifier) -> SoftPrompt:
        import peft
        from peft.tuners.prompt_tuning import PromptEmbedding

        backbone, c = classifier.backbone, self.config
        words = backbone.input_embeddings
        peft_config = peft.PromptTuningConfig(
            num_virtual_tokens=c.num_virtual_tokens,
            token_dim=words.embedding_dim,
            num_transformer_submodules=1,
            prompt_tuning_init="SAMPLE_VOCAB" if c.init == "vocab" else "RANDOM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            embedding = PromptEmbedding(peft_config, words)
        if c.init in ("labels", "text"):
            # peft's TEXT init would reload the tokenizer by path and keep its special tokens; the same
            # table filled from this classifier's own token ids
            ids = init_token_ids(classifier, c.init, c.init_text, c.num_virtual_tokens)
            with torch.no_grad():
                embedding.embedding.weight.copy_(words(ids).to(embedding.embedding.weight.dtype))  # (P, E)
        return VirtualTokens(embedding, c.num_virtual_tokens)


@register_method
class PrefixTuning(SoftPromptMethod):
    name = "prefix-tuning"
    summary = "prefix tuning (Li & Liang): trainable key/value prefixes in every layer (peft)"
    config_class = PrefixTuningConfig
    prompt_class = KeyValuePrefix
    config: PrefixTuningConfig

    def check_backbone(self, backbone: Backbone) -> None:
        check_prefix_cache(self.name, backbone)
        check_room_for_virtual_tokens(self.name, backbone, self.config.num_virtual_tokens)

    def build_prompt(self, classifier: Classifier) -> SoftPrompt:
        import peft
        from peft.tuners.prefix_tuning import PrefixEncoder

        backbone, c = classifier.backbone, self.config
        shape = CacheShape.of(backbone.model.config)
        peft_config = peft.PrefixTuningConfig(
            num_virtual_tokens=c.num_virtual_tokens,
            token_dim=shape.kv_heads * shape.head_dim,  # one layer's key (or value) width, as peft sizes GQA
            num_attention_heads=shape.kv_heads,
            num_layers=shape.layers,
            num_transformer_submodules=1,
            prefix_projection=c.projection,
            encoder_hidden_size=shape.kv_heads * shape.head_dim,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            encoder = PrefixEncoder(peft_config)
        if c.init in ("labels", "text"):
            ids = init_token_ids(classifier, c.init, c.init_text, c.num_virtual_tokens)
            encoder.load_prompt_embeddings(real_activations(backbone, ids))
        return KeyValuePrefix(encoder, c.num_virtual_tokens, shape)


@register_method
class PTuning(SoftPromptMethod):
    name = "p-tuning"
    summary = "P-tuning (Liu et al.): virtual tokens from an MLP/LSTM prompt encoder (peft)"
    config_class = PTuningConfig
    prompt_class = VirtualTokens
    config: PTuningConfig

    def check_backbone(self, backbone: Backbone) -> None:
        check_room_for_virtual_tokens(self.name, backbone, self.config.num_virtual_tokens)

    def build_prompt(self, classifier: Classifier) -> SoftPrompt:
        import peft
        from peft.tuners.p_tuning import PromptEncoder

        c = self.config
        model_config = classifier.backbone.model.config
        token_dim = classifier.backbone.input_embeddings.embedding_dim
        peft_config = peft.PromptEncoderConfig(
            num_virtual_tokens=c.num_virtual_tokens,
            token_dim=token_dim,
            num_transformer_submodules=1,
            num_attention_heads=model_config.num_attention_heads,
            num_layers=model_config.num_hidden_layers,
            encoder_reparameterization_type=c.encoder.upper(),
            encoder_hidden_size=c.encoder_hidden_size or token_dim,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            encoder = PromptEncoder(peft_config)
        return VirtualTokens(encoder, c.num_virtual_tokens)
