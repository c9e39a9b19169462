"""A sentence encoder cut in two: the lower layers every task of a process shares, and the top layers a
task owns, kept packed.

`SharedEncoder` is the base (one per model, device and cut, `sentence_reader.shared_encoder`; the cuts of
one model share its weights, `at_cut`): frozen, its lower layers run once per text and kept in a bounded
cache keyed by the text (`lower`), its top layers replaced by a task's own for each forward (`upper`, on
`top_module` or `serving_module`).

Pooling is read from the model folder (modules.json, 1_Pooling/config.json, through the loaded
sentence-transformers modules), not assumed: Transformer, Pooling in mean mode, then Normalize (or no
Normalize: the rows are unit either way, as `encode(normalize_embeddings=True)` gives them). Anything
else (CLS or max pooling, a Dense module) is refused, as is a model other than MPNet, whose layers
`SharedEncoder` calls itself (with MPNet's relative position bias).

A task's state is its top layers packed (`pack_state`), in memory and on disk: each weight matrix in
int8 with a float16 scale per output row, the biases and LayerNorms in float16. float32 layers would be
113 MB at L = 4 (28,351,488 parameters) and float16 ones 56.7 MB, over the 50 MB a task may own; packed
they take 28.4 MB. Measured against the float32 layers they were rounded from, after tuning at the
defaults (trec, seed 13, 16 per class; the 96 dev texts as queries, the 96 training texts as the book):
the packed layers' embeddings have cosine >= 0.99977 with float32's (largest coordinate error 4.7e-3;
float16's: 0.9999998 and 8.6e-5), the kNN top-1 neighbour of 95 of the 96 queries is kept, and dev
accuracy stays 83.3 (the frozen encoder's: 54.2). Unpacking them into float32 modules costs 80 ms, so a
base keeps the modules of the tasks it read most recently (`SharedEncoder.serving_module`, 4 of them);
a task read again meanwhile is not unpacked again. Tasks never swap weights in a shared module.

Measured on a 2-core x86-64 CPU (Intel Xeon, Sapphire Rapids) under a load of 2 to 4, so times vary by
up to 2x and the second thread often helps little or hurts; all-mpnet-base-v2, max_length 128, L = 2
(before the probe chose 4), float32 compute:
- `tune` at the defaults (60 steps, batches of 30 from 6 labels) on trec's 96 training texts (10 words
  on average): 27 s with 1 thread (29 s with the lower pass of a cold cache), 66 s with 2; the loss
  goes from 3.15 to 1.40 with either.
- `embed` of 1,000 texts (11.5 words, 15 tokens): 28 s from a cold cache (lower and upper, 1 thread; 26 s with
  2); again from the cache (upper only): 3.2 s with 1 thread, 1.6 to 1.9 s with 2. Their lower
  states take 46 MB of the cache.
- at L = 4, `tune` on trec's 96 texts took 82 s with 1 thread.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from openbook.artifacts import sha256_file
from openbook.devices import default_device, require_device, resolve_device
from openbook.encoders import ENCODERS, encoder_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class BaseSpec(Protocol):
    """What names a base: the encoder, the cut and the tokens per text (`sentence_reader.ReaderConfig`)."""

    @property
    def encoder(self) -> str: ...

    @property
    def top_layers(self) -> int: ...

    @property
    def max_length(self) -> int: ...


# A task's top layers, in memory and on disk (see the module's docstring): each weight matrix in int8, one
# float16 scale per output row beside it (under its key + SCALE_SUFFIX); every other tensor in float16.
STATE_DTYPE = torch.float16
MATRIX_DTYPE = torch.int8
SCALE_SUFFIX = ".scale"
DEFAULT_CACHE_BYTES = 512 << 20  # the lower states kept: ~11,000 texts of 15 tokens at hidden size 768
BATCH_TEXTS = 64  # texts per forward when embedding
SERVING_MODULES = 4  # tasks' top layers kept unpacked in float32 per base (`SharedEncoder.serving_module`)
# A task may own LoRA adapters (Hu et al., ICLR 2022) over the top layers instead of the layers themselves
# (`SharedEncoder.adapted_module`): on every linear layer of MPNet's (attention's q, k, v, o and the
# feed-forward's two `dense`), each update scaled by alpha / r = 2.
ADAPTER_TARGETS = ("q", "k", "v", "o", "dense")
ADAPTER_SCALE = 2.0
ADAPTER_KEY = "lora_"  # what names an adapter's tensors in a state


class SharedEncoder:
    """A sentence-transformers model loaded once per (encoder, device, cut), frozen, in eval mode: the
    lower layers every task shares (`lower`, cached) and the top layers a task's own replace (`upper`).
    Its parameters are never trained; `lower`'s cache is thread-safe."""

    def __init__(
        self,
        model: SentenceTransformer,
        *,
        name: str,
        weights_file: Path,
        top_layers: int,
        max_length: int,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        _check_pipeline(model)
        self.model = model.eval().requires_grad_(False)
        self.model.max_seq_length = max_length
        # an MPNetModel: its submodules (embeddings, encoder) are attributes nn.Module leaves untyped
        self.auto: Any = cast(Any, model[0]).auto_model
        self.layers: nn.ModuleList = self.auto.encoder.layer
        if not 1 <= top_layers <= len(self.layers):
            raise ValueError(f"top_layers must be within 1..{len(self.layers)} for {name}, got {top_layers}")
        config = self.auto.config  # MPNet numbers positions from its pad id + 1
        positions = int(config.max_position_embeddings) - int(config.pad_token_id) - 1
        if max_length > positions:
            raise ValueError(f"max_length must be at most {positions} for {name}, got {max_length}")
        self.name = name
        self.weights_file = weights_file
        self.top_layers = top_layers
        self.max_length = max_length
        self.cut = len(self.layers) - top_layers
        self.device = next(self.auto.parameters()).device
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()  # text -> (T, H), least recent first
        self._cached_bytes = 0
        self._lock = threading.Lock()
        # the unpacked top layers of the tasks read most recently: id(state) -> (state, module)
        self._serving: OrderedDict[int, tuple[dict[str, torch.Tensor], nn.ModuleList]] = OrderedDict()
        self._serving_lock = threading.Lock()

    @classmethod
    def load(cls, config: BaseSpec, device: str | None = None, **options: Any) -> SharedEncoder:
        """The base `config` names, on `device` (default: openbook.devices.default_device())."""
        from sentence_transformers import SentenceTransformer

        folder = encoder_dir(config.encoder) if config.encoder in ENCODERS else Path(config.encoder)
        if not (folder / "modules.json").is_file():  # never looked up on a hub
            raise FileNotFoundError(f"{config.encoder!r} is neither a registered encoder nor a model folder")
        device = resolve_device(device or default_device())
        require_device(device)
        model = SentenceTransformer(str(folder), device=device, local_files_only=True)
        return cls(
            model,
            name=config.encoder,
            weights_file=folder / "model.safetensors",
            top_layers=config.top_layers,
            max_length=config.max_length,
            **options,
        )

    def at_cut(self, top_layers: int) -> SharedEncoder:
        """This base cut before its top `top_layers` instead: the same model (its weights in memory
        once), its own cache of the states entering those layers."""
        return type(self)(
            self.model,
            name=self.name,
            weights_file=self.weights_file,
            top_layers=top_layers,
            max_length=self.max_length,
            cache_bytes=self.cache_bytes,
        )

    @cached_property
    def weights_sha256(self) -> str:
        """The sha256 of the model's weights file (0.3 s for all-mpnet-base-v2's 438 MB, once)."""
        return sha256_file(self.weights_file)

    @property
    def hidden_size(self) -> int:
        return int(self.auto.config.hidden_size)

    def serves(self, config: BaseSpec) -> None:
        """ValueError unless `config` names this base: its encoder, its cut and its max_length."""
        mine = (self.name, self.top_layers, self.max_length)
        theirs = (config.encoder, config.top_layers, config.max_length)
        if mine != theirs:
            raise ValueError(
                f"the config asks for (encoder, top_layers, max_length) = {theirs}, this base is {mine}"
            )

    def top_state(self) -> dict[str, torch.Tensor]:
        """The base's own top layers, as a task's state names them (`0.attention.attn.q.weight`, ...)."""
        return nn.ModuleList(self.layers[self.cut :]).state_dict()

    def top_module(self, state: dict[str, torch.Tensor] | None, *, trainable: bool = False) -> nn.ModuleList:
        """The top layers that run a task's `state` (None: the base's own), in float32. Untrainable, the
        base's own are its modules; otherwise a new module of fresh tensors, so that running it or
        training it neither touches the base nor races another task's forward."""
        if state is None and not trainable:
            return nn.ModuleList(self.layers[self.cut :])
        source = self.top_state() if state is None else unpack_state(state)
        with torch.device("meta"):  # built without initialising weights, then given `source`'s
            module = nn.ModuleList(type(layer)(self.auto.config) for layer in self.layers[self.cut :])
        copies = {key: tensor.to(self.device, torch.float32, copy=True) for key, tensor in source.items()}
        module.load_state_dict(copies, assign=True)
        return module.train(trainable).requires_grad_(trainable)

    def adapted_module(
        self, state: dict[str, torch.Tensor] | None, rank: int, *, trainable: bool = False
    ) -> nn.ModuleList:
        """The top layers reading the base's own weights (the same tensors, frozen) through LoRA adapters
        of `rank` (ADAPTER_TARGETS): `state`'s (packed, `adapter_state`), or fresh ones (B = 0: the
        base's own answer) where it is None. Trainable, only the adapters train, dropout on; the base is
        never touched, nor another task's module."""
        import peft

        top = nn.ModuleList(self.layers[self.cut :])
        memo: dict[int, Any] = {id(p): nn.Parameter(p.data, requires_grad=False) for p in top.parameters()}
        memo.update({id(b): b for b in top.buffers()})
        module = copy.deepcopy(top, memo)
        config = peft.LoraConfig(
            r=rank,
            lora_alpha=ADAPTER_SCALE * rank,  # type: ignore[arg-type]  # peft annotates int, only divides
            target_modules=list(ADAPTER_TARGETS),
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # A's init does not depend on the caller's RNG
            peft.inject_adapter_in_model(config, module)
        if state is not None:
            adapters = {k: t.to(self.device, torch.float32) for k, t in unpack_state(state).items()}
            expected = set(adapter_state(module))
            if set(adapters) != expected:
                raise ValueError(f"adapters of other layers or targets than rank {rank} on {self.name}")
            module.load_state_dict(adapters, strict=False)
        module.train(trainable)
        for name, parameter in module.named_parameters():
            parameter.requires_grad_(trainable and ADAPTER_KEY in name)
        return module

    def merged_state(self, adapters: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """The base's top layers with `adapters` (packed, `adapter_state`'s names) added into the weights
        they adapt, in float32 (None where there are none: the base's own)."""
        if adapters is None:
            return None
        state = {key: tensor.to(torch.float32, copy=True) for key, tensor in self.top_state().items()}
        factors = unpack_state(adapters)
        for key, a in factors.items():
            if _LORA_A in key:
                b = factors[key.replace(_LORA_A, _LORA_B)]
                state[_adapted_weight(key)] += ADAPTER_SCALE * (b @ a)
        return state

    def extracted_adapters(self, tuned: nn.ModuleList, rank: int) -> dict[str, torch.Tensor]:
        """Adapters of `rank` (the names and shapes `adapted_module` gives them) that keep of each adapted
        matrix's change in `tuned` (a `top_module`, tuned in full) its best rank-`rank` approximation, the
        truncated SVD: B A ADAPTER_SCALE = U_r S_r V_r^T, the singular values split evenly between the
        factors. The other tensors' changes (biases, LayerNorms) are not kept."""
        own, weights = self.top_state(), tuned.state_dict()
        adapters = {}
        for key in adapter_state(self.adapted_module(None, rank)):
            if _LORA_A not in key:
                continue
            weight = _adapted_weight(key)
            change = weights[weight].detach().float().cpu() - own[weight].float().cpu()
            u, s, vh = torch.linalg.svd(change, full_matrices=False)
            root = (s[:rank] / ADAPTER_SCALE).sqrt()
            adapters[key] = root[:, None] * vh[:rank]  # (rank, in)
            adapters[key.replace(_LORA_A, _LORA_B)] = u[:, :rank] * root  # (out, rank)
        return adapters

    def serving_module(self, state: dict[str, torch.Tensor] | None) -> nn.ModuleList:
        """`top_module(state)` for reading (adapters merged into their layers first), kept for the
        SERVING_MODULES states read most recently: unpacking a task's int8 layers costs a request 80 ms at
        L = 4 (float32 layers take 113 MB at L = 4, 340 MB at 12, so only these few are kept unpacked).
        Read-only: shared by concurrent forwards."""
        if state is None:
            return self.top_module(None)
        with self._serving_lock:
            kept = self._serving.get(id(state))
            if kept is not None and kept[0] is state:
                self._serving.move_to_end(id(state))
                return kept[1]
        # adapters are merged into dense layers to serve: through peft's modules a forward of 32 texts
        # took 1.45x as long (one text 1.12x), merged as long as whole layers (2-core x86-64 CPU)
        module = self.top_module(state if adapter_rank(state) is None else self.merged_state(state))
        with self._serving_lock:
            self._serving[id(state)] = (state, module)  # the state kept too: its id is not reused meanwhile
            while len(self._serving) > SERVING_MODULES:
                self._serving.popitem(last=False)
        return module

    def lower(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """Each text's hidden states entering the top layers, unpadded: (T_i, H), float32. A text found
        in the cache is not run again; the cache keeps the most recently used texts up to cache_bytes."""
        found: dict[str, torch.Tensor] = {}
        with self._lock:
            for text in texts:
                if text in self._cache:
                    self._cache.move_to_end(text)
                    found[text] = self._cache[text]
        missing = {text for text in texts if text not in found}
        by_length = sorted(missing, key=len, reverse=True)  # similar lengths share a batch
        for start in range(0, len(by_length), BATCH_TEXTS):
            chunk = by_length[start : start + BATCH_TEXTS]
            found.update(zip(chunk, self._lower_batch(chunk), strict=True))
        with self._lock:  # in the order given: the last text is the most recent
            for text in dict.fromkeys(texts):
                if text in missing:
                    self._remember(text, found[text])
        return [found[text] for text in texts]

    @torch.no_grad()
    def _lower_batch(self, texts: list[str]) -> list[torch.Tensor]:
        features = self.model.preprocess(texts)
        input_ids = features["input_ids"].to(self.device)  # (B, T), padded on the right
        keep = features["attention_mask"].to(self.device).bool()  # (B, T)
        hidden = self.auto.embeddings(input_ids=input_ids)  # (B, T, H)
        hidden = self._run(self.layers[: self.cut], hidden, keep)
        return [hidden[row, : int(length)].clone() for row, length in enumerate(keep.sum(1))]

    def _remember(self, text: str, states: torch.Tensor) -> None:
        size = states.numel() * states.element_size()
        if text in self._cache or size > self.cache_bytes:
            return
        self._cache[text] = states
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.numel() * dropped.element_size()

    def upper(self, states: Sequence[torch.Tensor], top: nn.ModuleList) -> torch.Tensor:
        """(B, H) unit sentence embeddings: the lower `states` through `top` (a `top_module`), mean
        pooled over each text's tokens and L2-normalised. Differentiable where `top` is trainable."""
        lengths = torch.tensor([len(s) for s in states], device=self.device)  # (B,)
        hidden = nn.utils.rnn.pad_sequence(list(states), batch_first=True)  # (B, T, H)
        keep = torch.arange(hidden.shape[1], device=self.device)[None, :] < lengths[:, None]  # (B, T)
        hidden = self._run(top, hidden, keep)
        pooled = (hidden * keep[..., None]).sum(1) / lengths[:, None]  # (B, H)
        return F.normalize(pooled, dim=-1)

    def _run(self, layers: Iterable[nn.Module], hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """MPNet's encoder loop over `layers`: padding masked additively, the relative position bias
        computed from the (frozen) shared table, as MPNetModel.forward does."""
        masked = ~keep[:, None, None, :]  # (B, 1, 1, T): no query attends to padding
        additive = torch.zeros(masked.shape, dtype=hidden.dtype, device=hidden.device)
        additive = additive.masked_fill(masked, torch.finfo(hidden.dtype).min)
        bias = self.auto.encoder.compute_position_bias(hidden)  # (B, heads, T, T)
        for layer in layers:
            hidden = layer(hidden, additive, bias)[0]
        return hidden


_LORA_A, _LORA_B = f".{ADAPTER_KEY}A.", f".{ADAPTER_KEY}B."


def _adapted_weight(adapter_key: str) -> str:
    """The weight an adapter's tensor adapts: `0.attention.attn.q.lora_A.default.weight` ->
    `0.attention.attn.q.weight`."""
    for marker in (_LORA_A, _LORA_B):
        if marker in adapter_key:
            return adapter_key.split(marker)[0] + ".weight"
    raise ValueError(f"{adapter_key} is not an adapter's tensor")


def truncated_adapters(adapters: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Adapters made by `extracted_adapters` (unpacked), cut to their first `rank` components: the same
    SVD's best rank-`rank` approximation."""
    cut = {}
    for key, tensor in adapters.items():
        cut[key] = tensor[:rank] if _LORA_A in key else tensor[:, :rank] if _LORA_B in key else tensor
    return cut


def adapter_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors of an `adapted_module`, by their names in it."""
    return {key: tensor for key, tensor in module.state_dict().items() if ADAPTER_KEY in key}


def adapter_rank(state: dict[str, torch.Tensor]) -> int | None:
    """The rank of the adapters a task's state holds; None for a state of whole top layers."""
    for key, tensor in state.items():
        if ADAPTER_KEY + "A" in key and not key.endswith(SCALE_SUFFIX):
            return int(tensor.shape[0])  # A: (r, in)
    return None


def pack_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Top layers as a task keeps them: each 2-D weight in int8, scaled per output row so that the row's
    largest magnitude is 127 (symmetric; the scale, in float16, under key + SCALE_SUFFIX); every other
    tensor (biases, LayerNorm) in float16. On the CPU."""
    packed = {}
    for key, tensor in state.items():
        values = tensor.detach().to("cpu", torch.float32)
        if values.dim() != 2:
            packed[key] = values.to(STATE_DTYPE)
            continue
        scale = (values.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12).to(STATE_DTYPE)  # (out, 1)
        packed[key] = torch.round(values / scale.float()).clamp(-127, 127).to(MATRIX_DTYPE)
        packed[key + SCALE_SUFFIX] = scale
    return packed


def unpack_state(packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pack_state`'s tensors back in float32 (each matrix times its row scales)."""
    return {
        key: (tensor.float() * packed[key + SCALE_SUFFIX].float())
        if tensor.dtype == MATRIX_DTYPE
        else tensor.float()
        for key, tensor in packed.items()
        if not key.endswith(SCALE_SUFFIX)
    }


def _check_pipeline(model: SentenceTransformer) -> None:
    """ValueError unless `model` is MPNet, then mean pooling, then (optionally) normalisation."""
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    modules = list(model)
    kinds = [type(module).__name__ for module in modules]
    if not (
        len(modules) in (2, 3)
        and isinstance(modules[0], Transformer)
        and isinstance(modules[1], Pooling)
        and all(isinstance(module, Normalize) for module in modules[2:])
    ):
        raise ValueError(f"a sentence reader runs Transformer, Pooling[, Normalize]; this model is {kinds}")
    if modules[1].pooling_mode != "mean":
        raise ValueError(
            f"a sentence reader pools by the mean; this model pools by {modules[1].pooling_mode}"
        )
    model_type = modules[0].auto_model.config.model_type
    if model_type != "mpnet":
        raise ValueError(f"a sentence reader cuts MPNet models; this one is {model_type!r}")
