"""The second reader of the open book: a sentence encoder cut in two, its top layers tuned per task.

all-mpnet-base-v2 (12 layers) is cut before its top L layers (`ReaderConfig.top_layers`, 4: the
dev probe's rule, docs/experiments/two-readers.md). The
lower layers are frozen and shared by every task of a process (`SharedEncoder`, one per model, device
and cut): each text's hidden states entering the top layers are computed once and kept in a bounded
cache keyed by the text. A task's reader (`SentenceReader`) owns only its copy of the top L layers,
tuned on the task's examples by the batch-wise supervised contrastive loss (Khosla et al. 2020,
`supervised_contrastive_loss`) on the cached states, so a training step costs the top layers' forward
and backward only, and re-embedding the stored examples after tuning runs the top layers alone.

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

The batches are class-balanced (`class_balanced_batches`) rather than random: the loss learns only
from anchors with a positive in the batch, and with 150 intents a random batch of 32 holds few pairs.
On trec (6 labels) the two are level: 79.2 on dev either way.

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

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from openbook.artifacts import sha256_file
from openbook.atomic import staged_directory
from openbook.contrastive import class_balanced_batches, supervised_contrastive_loss
from openbook.devices import default_device, require_device, resolve_device
from openbook.encoders import ENCODERS, encoder_dir

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# A task's top layers, in memory and on disk (see the module's docstring): each weight matrix in int8, one
# float16 scale per output row beside it (under its key + SCALE_SUFFIX); every other tensor in float16.
STATE_DTYPE = torch.float16
MATRIX_DTYPE = torch.int8
SCALE_SUFFIX = ".scale"
STATE_FILE = "reader.safetensors"
CONFIG_FILE = "reader_config.json"
FORMAT_VERSION = 2  # 1: every tensor float16
DEFAULT_CACHE_BYTES = 512 << 20  # the lower states kept: ~11,000 texts of 15 tokens at hidden size 768
BATCH_TEXTS = 64  # texts per forward when embedding
SERVING_MODULES = 4  # tasks' top layers kept unpacked in float32 per base (`SharedEncoder.serving_module`)


@dataclass(frozen=True)
class ReaderConfig:
    """How a task's sentence reader is built and tuned. `encoder`, `top_layers` and `max_length` name
    the shared base it runs on (`SharedEncoder.load(config)`); the rest is the tuning."""

    encoder: str = field(
        default="mpnet",
        metadata={"help": "the sentence encoder: a registered name (openbook.encoders) or a model folder"},
    )
    top_layers: int = field(
        default=4, metadata={"help": "the encoder's top layers a task tunes and owns; the rest are shared"}
    )
    max_length: int = field(default=128, metadata={"help": "tokens per text; longer texts are cut"})
    steps: int = field(default=60, metadata={"help": "optimiser steps of a tuning"})
    batch_size: int = field(
        default=32, metadata={"help": "texts per step, class-balanced (the loss compares them in the batch)"}
    )
    lr: float = field(default=1e-4, metadata={"help": "AdamW's learning rate"})
    temperature: float = field(default=0.1, metadata={"help": "the contrastive loss's temperature"})
    seed: int = field(default=13, metadata={"help": "the batches' and the dropout's seed"})

    def __post_init__(self) -> None:
        if not self.encoder:
            raise ValueError("encoder must name a registered encoder or a model folder")
        if min(self.top_layers, self.max_length, self.steps) < 1:
            raise ValueError(
                f"top_layers, max_length and steps must be at least 1, got "
                f"{self.top_layers}, {self.max_length}, {self.steps}"
            )
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be at least 2 (a positive pair), got {self.batch_size}")
        if not (self.lr > 0 and self.temperature > 0):
            raise ValueError(f"lr and temperature must be positive, got {self.lr}, {self.temperature}")


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
    def load(cls, config: ReaderConfig, device: str | None = None, **options: Any) -> SharedEncoder:
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

    @cached_property
    def weights_sha256(self) -> str:
        """The sha256 of the model's weights file (0.3 s for all-mpnet-base-v2's 438 MB, once)."""
        return sha256_file(self.weights_file)

    @property
    def hidden_size(self) -> int:
        return int(self.auto.config.hidden_size)

    def serves(self, config: ReaderConfig) -> None:
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

    def serving_module(self, state: dict[str, torch.Tensor] | None) -> nn.ModuleList:
        """`top_module(state)` for reading, kept for the SERVING_MODULES states read most recently: unpacking
        a task's int8 layers costs a request 80 ms at L = 4 (float32 layers take 113 MB, so only these few
        are kept unpacked). Read-only: shared by concurrent forwards."""
        if state is None:
            return self.top_module(None)
        with self._serving_lock:
            kept = self._serving.get(id(state))
            if kept is not None and kept[0] is state:
                self._serving.move_to_end(id(state))
                return kept[1]
        module = self.top_module(state)
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


_SHARED: dict[tuple[str, int, int, str], SharedEncoder] = {}
_SHARED_LOCK = threading.Lock()


def shared_encoder(config: ReaderConfig, device: str | None = None) -> SharedEncoder:
    """The process's one base for `config`'s (encoder, top_layers, max_length) on `device`: every task's
    reader runs on it, so a hundred tasks hold one copy of the encoder and their own top layers."""
    resolved = resolve_device(device or default_device())
    key = (config.encoder, config.top_layers, config.max_length, resolved)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = SharedEncoder.load(config, resolved)
        return _SHARED[key]


def untuned_reader(encoder: str | ReaderConfig, device: str | None = None) -> SentenceReader:
    """A new task's reader: `encoder` (a registered name or a model folder, at the defaults, or a config)
    on the process's shared base, its top layers the base's own until tuned."""
    config = ReaderConfig(encoder=encoder) if isinstance(encoder, str) else encoder
    return SentenceReader(shared_encoder(config, device), None, config)


def reader_config_of(description: dict[str, Any]) -> ReaderConfig:
    """The config of the base a `SentenceReader.description` names (its own tuning where it has one)."""
    saved = description["base"]
    tuning = description.get("config") or {}
    return ReaderConfig(
        **{
            **tuning,
            "encoder": saved["name"],
            "top_layers": saved["top_layers"],
            "max_length": saved["max_length"],
        }
    )


def _forked_rng(device: torch.device) -> AbstractContextManager[None]:
    """The torch RNG of the CPU and of `device` restored on leaving the block (seeded within it)."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device.index or 0], device_type=device.type)


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


class SentenceReader:
    """A task's sentence reader: the shared `base` and the task's own top layers (`layers`, packed by
    `pack_state`; None: the base's own, untuned, zero bytes of its own). Three calls: `tune`, `embed`,
    `save`/`load`."""

    def __init__(
        self,
        base: SharedEncoder,
        layers: dict[str, torch.Tensor] | None = None,
        config: ReaderConfig | None = None,
    ) -> None:
        self.base = base
        self.layers = layers
        self.config = config

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(N, H) float32 unit rows, one per text."""
        if not texts:
            return np.zeros((0, self.base.hidden_size), dtype=np.float32)
        states = self.base.lower(texts)
        top = self.base.serving_module(self.layers)
        order = np.argsort([-len(s) for s in states], kind="stable")  # similar lengths share a batch
        rows = np.empty((len(texts), self.base.hidden_size), dtype=np.float32)
        with torch.no_grad():
            for start in range(0, len(order), BATCH_TEXTS):
                chosen = order[start : start + BATCH_TEXTS]
                rows[chosen] = self.base.upper([states[i] for i in chosen], top).cpu().numpy()
        return rows

    def tune(
        self,
        texts: Sequence[str],
        labels: Sequence[str],
        config: ReaderConfig,
        on_step: Callable[[int, float], None] | None = None,
    ) -> list[float]:
        """Tune the task's top layers (the base's own on the first tune) on the labelled texts by the
        supervised contrastive loss, AdamW, `config.steps` class-balanced batches, dropout on; the
        returned losses are each step's. Deterministic given `config.seed` on a CPU: the batches and the
        dropout are seeded, and the caller's torch RNG is left as it was."""
        self.base.serves(config)
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        names = sorted(set(labels))
        gold = np.array([names.index(label) for label in labels])
        if np.bincount(gold).max(initial=0) < 2:
            raise ValueError("tuning needs a label with at least two texts: the loss pulls pairs together")
        states = self.base.lower(texts)
        top = self.base.top_module(self.layers, trainable=True)
        optimizer = torch.optim.AdamW(top.parameters(), lr=config.lr)
        gold_tensor = torch.as_tensor(gold, device=self.base.device)
        losses: list[float] = []
        with _forked_rng(self.base.device):
            torch.manual_seed(config.seed)
            batches = class_balanced_batches(gold, config.batch_size, config.steps, config.seed)
            for step, batch in enumerate(batches):
                embeddings = self.base.upper([states[i] for i in batch], top)  # (B, H)
                loss = supervised_contrastive_loss(embeddings, gold_tensor[batch], config.temperature)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                if on_step is not None:
                    on_step(step, losses[-1])
        # one assignment: a concurrent `embed` reads the old layers or the new ones
        self.layers = pack_state(top.state_dict())
        self.config = config
        return losses

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The task's own tensors: its top layers as kept (`pack_state`); empty while untuned."""
        return dict(self.layers or {})

    def description(self) -> dict[str, Any]:
        """What rebuilds this reader around its tensors (JSON): the config, the base's name, weights sha256
        and cut, whether it is tuned. `save` writes it; a classifier's checkpoint keeps it in its manifest."""
        return {
            "format": FORMAT_VERSION,
            "config": None if self.config is None else asdict(self.config),
            "base": {
                "name": self.base.name,
                "weights_sha256": self.base.weights_sha256,
                "top_layers": self.base.top_layers,
                "max_length": self.base.max_length,
            },
            "dtype": "int8 matrices, float16 row scales and vectors",
            "tuned": self.layers is not None,
        }

    def copy(self) -> SentenceReader:
        """A reader of its own on the same base: tuning it leaves this one as it is."""
        return SentenceReader(self.base, self.layers, self.config)

    def save(self, directory: str | Path) -> Path:
        """Write `directory` (atomically): reader.safetensors (the top layers, when tuned) and
        reader_config.json (`description`)."""
        target = Path(directory)
        description = self.description()
        with staged_directory(target) as staging:
            if self.layers is not None:
                save_file({key: t.contiguous() for key, t in self.layers.items()}, str(staging / STATE_FILE))
            (staging / CONFIG_FILE).write_text(json.dumps(description, indent=2) + "\n")
        return target

    @classmethod
    def load(cls, directory: str | Path, base: SharedEncoder) -> SentenceReader:
        """The reader saved in `directory`, on `base`; ValueError when it was made on another base
        (its weights), another cut or another max_length, or its tensors do not fit the top layers."""
        source = Path(directory)
        description = json.loads((source / CONFIG_FILE).read_text())
        layers = load_file(str(source / STATE_FILE)) if description.get("tuned") else None
        return cls.restore(description, layers, base, str(source))

    @classmethod
    def restore(
        cls,
        description: dict[str, Any],
        layers: dict[str, torch.Tensor] | None,
        base: SharedEncoder,
        source: str = "the reader",
    ) -> SentenceReader:
        """The reader `description` describes, its top layers `layers` (None: untuned), on `base`;
        ValueError as `load` says."""
        if description.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{source}: reader format {description.get('format')}, expected {FORMAT_VERSION}"
            )
        saved = description["base"]
        mine = {
            "weights_sha256": base.weights_sha256,
            "top_layers": base.top_layers,
            "max_length": base.max_length,
        }
        differing = {key: (saved[key], value) for key, value in mine.items() if saved[key] != value}
        if differing:
            raise ValueError(f"{source} was made on another base: (saved, this base) = {differing}")
        config = None if description["config"] is None else ReaderConfig(**description["config"])
        if not description["tuned"]:
            return cls(base, None, config)
        if layers is None:
            raise ValueError(f"{source}: a tuned reader without its top layers")
        expected = {key: (t.shape, t.dtype) for key, t in pack_state(base.top_state()).items()}
        found = {key: (t.shape, t.dtype) for key, t in layers.items()}
        if found != expected:
            raise ValueError(f"{source}: its tensors are not {base.top_layers} top layers of {base.name}")
        return cls(base, layers, config)
