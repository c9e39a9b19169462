"""Load a Hugging Face language model and read the prompt's slot.

For a batch of prompts the backbone returns, at the slot:

- the slot representation: the hidden state of `layer` (default: the last
  layer, as RetroPrompt keys its store) at the `[MASK]` position of a masked
  LM, or at the last position of a causal LM (the state that predicts the
  next token);
- log P(label word | prompt) for every label.

Multi-token label words. For a causal LM the score is exact:
log P(w1..wL | x) = sum_t log p(w_t | x, w_<t), computed with one extra call
that feeds every label's remaining tokens at once, as a token tree over the
prompt's KV cache (`word_scores.py`). A masked LM has one slot, so a
multi-token word is scored by the mean log-probability of its pieces at that
slot (an approximation; prefer single-token words).

What needs only the slot vector (store keys, retrieval queries) calls
`slot_vectors`, which scores no label and runs no LM head.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from openbook.compiled import LENGTH_STEP, ROWS_BASE, CompiledForward, buckets, pad_batch
from openbook.devices import (
    DEVICE_ENV,
    DtypeName,
    default_device,
    default_dtype,
    require_device,
    resolve_device,
    resolve_dtype,
)
from openbook.models import DEFAULT_BACKBONE, backbone_config
from openbook.prompting import EncodedBatch, PromptEncoder, Template, Verbalizer
from openbook.prompting.encoder import BackboneKind, DemoLayout
from openbook.word_scores import LabelScoring, label_vector_log_probs, word_log_probs, word_tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class BackboneConfig:
    """Which model, read where, cut how, on which device: the defaults every door (`create_classifier`,
    the `openbook` commands, the service's settings and trainer) reads from here (`config_fields.py`)."""

    name: str = DEFAULT_BACKBONE
    layer: int = field(
        default=-1, metadata={"help": "hidden layer of the slot representation: 0 embeddings, -1 the last"}
    )
    # 128: what the service, the command line and `create_classifier` have always cut at, and the records
    # were made with (but `openbook first-use`'s, which read this default when it was 256).
    max_length: int = field(default=128, metadata={"help": "tokens per prompt; longer texts are cut"})
    device: str = field(
        default_factory=default_device,
        metadata={
            "help": f"cpu, cuda, cuda:N, mps, or auto: cuda when a GPU is visible (${DEVICE_ENV}, else auto)"
        },
    )
    kind: Literal["auto", "masked", "causal"] = "auto"
    # Weights load in this dtype; slot vectors and label log-probs leave `Backbone.forward` as float32.
    dtype: DtypeName = field(default_factory=default_dtype)

    def __post_init__(self) -> None:
        if self.dtype not in get_args(DtypeName):
            raise ValueError(f"dtype must be one of {', '.join(get_args(DtypeName))}, got {self.dtype!r}")


@dataclass
class PromptedInput:
    embeds: torch.Tensor  # (B, T', E) what the backbone runs on
    batch: EncodedBatch  # masks and indices that match `embeds`
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # extra inputs, e.g. past_key_values


class InputPrompt(Protocol):
    """What `Backbone.forward` asks of a trainable prompt; `soft_prompts.SoftPrompt` implements it."""

    scores_labels: bool  # True: `label_logits` replaces the LM head's label-word scores

    def __call__(self, embeds: torch.Tensor, batch: EncodedBatch, backbone: Backbone) -> PromptedInput: ...

    def label_logits(self, features: torch.Tensor) -> torch.Tensor: ...  # (B, H) -> (B, C)


@dataclass
class SlotOutput:
    hidden: torch.Tensor  # (B, H) slot representation
    label_log_probs: torch.Tensor  # (B, C) log P(label word | prompt), or a prompt's own label scores


@dataclass
class _PreparedRun:
    """What `Backbone._prepare` hands a forward: the model to call, its inputs, and their bookkeeping."""

    model: Any  # the eager model, or the compiled one when the batch was padded to a bucket
    kwargs: dict[str, Any]
    batch: EncodedBatch  # as the model reads it (padded to the bucket, prompted)
    real: int  # rows to answer: the rows given, before any padding to a bucket
    compiled: bool
    lock: AbstractContextManager[Any]  # held while calling the model and reading its outputs


class Backbone:
    def __init__(
        self, model: PreTrainedModel, tokenizer: Any, kind: BackboneKind, config: BackboneConfig
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.kind = kind
        self.config = config
        self.device = torch.device(resolve_device(config.device))
        params = inspect.signature(model.forward).parameters
        self._keeps_last_logits = kind == "causal" and "logits_to_keep" in params
        self.compiled: CompiledForward | None = None  # set by `compile`

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights are in now (the input embeddings' dtype)."""
        return self.input_embeddings.weight.dtype

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def input_embeddings(self) -> nn.Embedding:
        # transformers types it as any Module; every backbone here reads tokens through an embedding
        # table (Gemma's scaled one subclasses nn.Embedding).
        return cast(nn.Embedding, self.model.get_input_embeddings())

    @property
    def input_embedding_scale(self) -> float:
        """The factor the input-embedding module multiplies its table by: 1.0 for most models.

        Gemma 3 multiplies by sqrt(hidden_size) inside that module (transformers' scaled word
        embeddings keep the factor as `embed_scale`), and `inputs_embeds` bypass it. So a vector read
        from `input_embeddings.weight`, or built to sit among token embeddings, is multiplied by this
        before the model reads it; calling `input_embeddings(ids)` applies it already.
        """
        return float(getattr(self.input_embeddings, "embed_scale", 1.0))

    @property
    def output_head(self) -> nn.Linear:
        """The LM head's output layer: `weight` (V, H) and maybe `bias` (V,)."""
        return self.model.get_output_embeddings()

    def input_embedding_table(self) -> torch.Tensor:
        """(V, E) the input layer's table as stored; the model reads a row times `input_embedding_scale`.

        Code that builds input vectors from the table (statistics of it, or rows of it) reads it here
        and applies the scale.
        """
        return self.input_embeddings.weight

    def compile(self, *, max_rows: int, mode: str | None = None) -> CompiledForward:
        """Compile the forward for every padded bucket up to `max_rows` prompts, then serve through it.

        `mode` defaults to "reduce-overhead" (CUDA graphs) on CUDA and "default" elsewhere. One
        compilation with symbolic rows and length serves every bucket; each bucket is then run once
        here (under "reduce-overhead" that records its CUDA graph). Blocking and slow: call it when
        the backbone is loaded, never on a request (see `compiled.py`).
        """
        mode = mode or ("reduce-overhead" if self.device.type == "cuda" else "default")
        self.compiled = CompiledForward(
            torch.compile(self.model, mode=mode, dynamic=True),
            buckets(max_rows, base=ROWS_BASE),
            buckets(self.config.max_length, step=LENGTH_STEP),
        )
        with torch.inference_mode():
            for batch in self.compiled.warm_up_batches(causal=self.kind == "causal"):
                self.forward(batch, [[0]])
        return self.compiled

    def encoder(
        self,
        template: Template,
        verbalizer: Verbalizer,
        *,
        demonstrations: DemoLayout = "none",
        demo_classes: int | None = None,
    ) -> PromptEncoder:
        return PromptEncoder(
            self.tokenizer,
            template,
            verbalizer,
            self.kind,
            self.config.max_length,
            demonstrations=demonstrations,
            demo_classes=demo_classes,
        )

    def forward(
        self,
        batch: EncodedBatch,
        label_token_ids: list[list[int]],
        demo_vectors: torch.Tensor | None = None,  # (B, C, H), already in input-embedding space
        prompt: InputPrompt | None = None,  # trainable prompt vectors (see `soft_prompts.py`)
        *,
        scoring: LabelScoring = "exact",
    ) -> SlotOutput:
        """The slot vector and every label's score: one forward, and for a causal LM's multi-token words
        one more call over their token tree (`word_scores.py`), whatever the number of labels.

        `scoring="vectors"` scores the labels by their vectors in the slot's space instead (see
        `word_scores.py`): no tree pass, no LM head. A prompt that scores the labels itself overrides both.
        """
        own_label_head = prompt is not None and prompt.scores_labels
        reads_head_input = own_label_head or scoring == "vectors"  # the labels are scored from h, not logits
        words = word_tree(label_token_ids) if self.kind == "causal" and not reads_head_input else None
        tails = words is not None and words.has_tails  # multi-token words: a pass over their tree follows
        # A hook on the head reads its input: the compiled forward, recorded without it, is left aside.
        run = self._prepare(batch, demo_vectors, prompt, compilable=not tails and not reads_head_input)
        batch, kwargs, real = run.batch, run.kwargs, run.real
        if self.kind == "causal":
            kwargs["use_cache"] = tails or "past_key_values" in kwargs
            if self._keeps_last_logits:
                kwargs["logits_to_keep"] = 1  # the slot is the last position: skip the LM head elsewhere
        features: list[torch.Tensor] = []  # the LM head's input, read when the labels are scored from it
        caller = threading.get_ident()

        def read_head_input(
            _module: nn.Module, args: tuple[torch.Tensor, ...]
        ) -> tuple[torch.Tensor, ...] | None:
            # Tasks whose methods keep the backbone frozen share it across threads: another task's
            # forward passes this hook too, and must not be read as this one's.
            if threading.get_ident() != caller:
                return None
            features.append(args[0])
            return (args[0][:, :0],)  # no logit is read: the head runs on no position

        head = self.output_head
        hook = head.register_forward_pre_hook(read_head_input) if reads_head_input else None
        rows, slots = torch.arange(real, device=self.device), batch.slot_index[:real]
        with run.lock:
            try:
                out = run.model(**kwargs)
            finally:
                if hook is not None:
                    hook.remove()
            hidden = out.hidden_states[self.config.layer][rows, slots].float()  # (B, H)
            if reads_head_input:
                head_input = features[-1]  # (B, T or 1, H)
                slot_features = (
                    head_input[:, -1] if self.kind == "causal" else head_input[rows, slots]
                ).float()
                if own_label_head:
                    assert prompt is not None
                    own = prompt.label_logits(slot_features).float()  # float32 under autocast too
                    return SlotOutput(hidden=hidden, label_log_probs=own)
                scores = label_vector_log_probs(head, label_token_ids, slot_features)
                return SlotOutput(hidden=hidden, label_log_probs=scores)
            slot_logits = out.logits[:real, -1] if self.kind == "causal" else out.logits[rows, slots]
            log_probs = F.log_softmax(slot_logits.float(), dim=-1)  # (B, V)
        if words is not None:
            assert batch.position_ids is not None  # a causal batch carries them
            scores = word_log_probs(
                self.model,
                words,
                log_probs,
                out.past_key_values,
                batch.attention_mask,
                batch.position_ids[:, -1],
            )
        else:
            scores = torch.stack(
                [log_probs[:, torch.tensor(ids, device=self.device)].mean(-1) for ids in label_token_ids],
                dim=-1,
            )
        return SlotOutput(hidden=hidden, label_log_probs=scores)

    def slot_vectors(
        self,
        batch: EncodedBatch,
        prompt: InputPrompt | None = None,
        demo_vectors: torch.Tensor | None = None,  # (B, C, H), already in input-embedding space
    ) -> torch.Tensor:
        """(B, H) float32: `forward(...).hidden` alone, for what reads no label score (store keys, queries).

        No label is scored. Eagerly the transformer body runs without its LM head (`base_model`); the
        compiled forward, recorded with the head at the slot, is used as it is when the batch fits a bucket
        (one position of the head costs less than leaving the recorded graph).
        """
        run = self._prepare(batch, demo_vectors, prompt, compilable=True)
        kwargs, model = run.kwargs, run.model
        if self.kind == "causal":
            kwargs["use_cache"] = "past_key_values" in kwargs  # a prefix prompt's cache is read, not kept
            if run.compiled and self._keeps_last_logits:
                kwargs["logits_to_keep"] = 1
        if not run.compiled:
            model = self.model.base_model  # the body alone: the same hidden states, no LM head
        rows, slots = torch.arange(run.real, device=self.device), run.batch.slot_index[: run.real]
        with run.lock:
            out = model(**kwargs)
            return out.hidden_states[self.config.layer][rows, slots].float()  # (B, H)

    def _prepare(
        self,
        batch: EncodedBatch,
        demo_vectors: torch.Tensor | None,
        prompt: InputPrompt | None,
        *,
        compilable: bool,
    ) -> _PreparedRun:
        """The model to call and its inputs: demonstrations injected, the prompt applied, and the batch
        padded to a compiled bucket when `compilable`, no prompt, and one fits."""
        batch = batch.to(self.device)
        real = batch.input_ids.shape[0]  # rows to answer; a compiled forward pads to its bucket
        model: Any = self.model
        bucket = None
        if self.compiled is not None and prompt is None and compilable:
            bucket = self.compiled.shape(batch)
        lock: AbstractContextManager[Any] = nullcontext()
        if bucket is not None:
            assert self.compiled is not None
            batch = pad_batch(batch, *bucket, left=self.kind == "causal")
            model = self.compiled.model
            # A compiled forward's outputs live in memory its next call overwrites (CUDA graphs): one
            # thread at a time calls it and copies out what it reads.
            lock = self.compiled.lock
            if demo_vectors is not None and (more := bucket[0] - real):  # padded rows repeat the last
                demo_vectors = torch.cat([demo_vectors, demo_vectors[-1:].expand(more, -1, -1)])
        embeds = self.input_embeddings(batch.input_ids)  # (B, T, H)
        if demo_vectors is not None:
            if batch.demo_index is None:
                raise ValueError("demonstration vectors given, but the batch was encoded without demo slots")
            rows = torch.arange(embeds.shape[0], device=self.device)[:, None]
            embeds = embeds.index_put((rows, batch.demo_index), demo_vectors.to(embeds.device, embeds.dtype))
        extra: dict[str, Any] = {}
        if prompt is not None:
            prompted = prompt(embeds, batch, self)
            embeds, batch, extra = prompted.embeds, prompted.batch, prompted.model_kwargs
        kwargs: dict[str, Any] = {
            "inputs_embeds": embeds,
            "attention_mask": batch.attention_mask,
            "output_hidden_states": True,
            **extra,
        }
        if self.kind == "causal":
            kwargs["position_ids"] = batch.position_ids
        return _PreparedRun(model, kwargs, batch, real, bucket is not None, lock)


@contextmanager
def float32_weights(*modules: nn.Module | None) -> Iterator[None]:
    """Inside the block every floating-point parameter and buffer of `modules` is float32; after it,
    each is cast back to the dtype it had.

    Training runs inside this: AdamW's update at lr 1e-5 is below half a bfloat16 ulp of most weights
    (8 significant bits), so steps taken on bf16 weights round back to the same weights and nothing
    is learnt. The float32 copy is the "master" the optimiser updates; casting back at the end rounds
    the trained weights once, to the serving dtype, which is also the dtype whose weights the base
    hash (`methods.weights_sha256`) was taken from. Parameters keep their identity, so an optimiser
    built inside the block sees the float32 tensors.
    """
    originals: list[tuple[torch.Tensor, torch.dtype]] = []
    for module in modules:
        if module is None:
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point() and tensor.dtype != torch.float32:
                originals.append((tensor, tensor.dtype))
                tensor.data = tensor.data.float()
    try:
        yield
    finally:
        for tensor, dtype in originals:
            tensor.data = tensor.data.to(dtype)
            if tensor.grad is not None:
                tensor.grad = None  # a float32 gradient no longer matches its tensor


# transformers builds models under process-wide patches (meta-device init), so two threads loading
# at once can leave one model with uninitialised weights: loads take turns.
_LOAD_LOCK = threading.Lock()


def load_backbone(config: BackboneConfig | None = None) -> Backbone:
    """Load by registered name (e.g. `smollm2-135m`, available offline), local path or hub id."""
    with _LOAD_LOCK:
        return _load_backbone(config or BackboneConfig())


def _load_backbone(config: BackboneConfig) -> Backbone:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    device = resolve_device(config.device)
    require_device(device)
    path, model_config = backbone_config(config.name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    kind = config.kind if config.kind != "auto" else detect_kind(model_config, tokenizer)
    dtype = resolve_dtype(config.dtype, device)
    # One call per class, not a call on the chosen class: transformers' decorators type the two auto
    # classes so differently that mypy cannot join them into one callable.
    if kind == "masked":
        model = AutoModelForMaskedLM.from_pretrained(path, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device).eval()
    return Backbone(model, tokenizer, kind, config)


def detect_kind(model_config: Any, tokenizer: Any) -> BackboneKind:
    architectures = model_config.architectures or []
    if any(a.endswith(("MaskedLM", "ForPreTraining")) for a in architectures):
        return "masked"
    if any(a.endswith("CausalLM") for a in architectures) or getattr(model_config, "is_decoder", False):
        return "causal"
    return "masked" if tokenizer.mask_token is not None else "causal"
