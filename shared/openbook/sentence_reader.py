"""The second reader of the open book: a sentence encoder cut in two, its top layers tuned per task.

all-mpnet-base-v2 (12 layers) is cut before its top L layers (`ReaderConfig.top_layers`). The lower
layers are frozen and shared by every task of a process (`SharedEncoder`, one per model, device and
cut): each text's hidden states entering the top layers are computed once and kept in a bounded cache
keyed by the text. A task's reader (`SentenceReader`) tunes the top L layers on the task's examples by
the batch-wise supervised contrastive loss (Khosla et al. 2020, `supervised_contrastive_loss`) on the
cached states, and owns either its copy of them (`adapters=0`) or adapters over them: LoRA's, trained,
or the truncated SVD of each adapted matrix's change after tuning the layers in full.

The defaults are the probes' rules (docs/experiments/two-readers.md): a job that holds at most 256
examples (`few_examples`) tunes all 12 layers in full and keeps each matrix's change at rank 32 (5.5 MB a
task, `FEW_EXAMPLES_TUNING`, probe 8: +1.0 on the judge sets' two readers); above, where that would run
past a job's budget (clinc150's 1,500 examples), the top 4 layers, owned whole (28.4 MB packed), 60 steps
at lr 1e-4 (probe 1). The base and the packing of a task's state are `split_encoder.py`'s.

The batches are class-balanced (`class_balanced_batches`) rather than random: the loss learns only
from anchors with a positive in the batch, and with 150 intents a random batch of 32 holds few pairs.
On trec (6 labels) the two are level: 79.2 on dev either way.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from openbook.atomic import staged_directory
from openbook.contrastive import class_balanced_batches, supervised_contrastive_loss
from openbook.devices import (
    Precision,
    PrecisionChoice,
    default_device,
    precision_context,
    resolve_device,
    resolve_precision,
)
from openbook.split_encoder import BATCH_TEXTS, SharedEncoder, adapter_rank, adapter_state, pack_state

AdaptersFrom = Literal["lora", "svd"]
STATE_FILE = "reader.safetensors"
CONFIG_FILE = "reader_config.json"
FORMAT_VERSION = 2  # 1: every tensor float16


# Where a job tunes its reader on few examples (probe 8, docs/experiments/two-readers.md): all the encoder's
# layers tuned in full, each adapted matrix's change kept at rank 32 (probe 7's `s12`). The cost that kept
# it from every job grows with the examples (each pass over the store runs all the layers: a clinc150 job
# of 1,500 examples ran past its 900 s), so above FEW_EXAMPLES the config's own top layers are tuned.
FEW_EXAMPLES = 256
FEW_EXAMPLES_TUNING: dict[str, Any] = {"adapters": 32, "adapters_from": "svd", "lr": 2e-5}


@dataclass(frozen=True)
class ReaderConfig:
    """How a task's sentence reader is built and tuned. `encoder`, `top_layers` and `max_length` name
    the shared base it runs on (`SharedEncoder.load(config)`); the rest is the tuning."""

    encoder: str = field(
        default="mpnet",
        metadata={"help": "the sentence encoder: a registered name (openbook.encoders) or a model folder"},
    )
    top_layers: int = field(
        default=4, metadata={"help": "the encoder's top layers a task tunes; the rest are shared"}
    )
    max_length: int = field(default=128, metadata={"help": "tokens per text; longer texts are cut"})
    steps: int = field(default=60, metadata={"help": "optimiser steps of a tuning"})
    batch_size: int = field(
        default=32, metadata={"help": "texts per step, class-balanced (the loss compares them in the batch)"}
    )
    adapters: int = field(
        default=0,
        metadata={
            "help": "the rank of LoRA adapters over every linear layer of the top layers, which a task then "
            "owns instead of the layers (a few MB); 0: the top layers themselves are tuned and owned"
        },
    )
    adapters_from: AdaptersFrom = field(
        default="lora",
        metadata={
            "help": "how the adapters are made (with adapters >= 1): lora trains them; svd tunes the top "
            "layers in full, then keeps the rank-`adapters` truncated SVD of each adapted matrix's change "
            "(biases and LayerNorms stay the base's)"
        },
    )
    lr: float = field(default=1e-4, metadata={"help": "AdamW's learning rate"})
    temperature: float = field(default=0.1, metadata={"help": "the contrastive loss's temperature"})
    seed: int = field(default=13, metadata={"help": "the batches' and the dropout's seed"})
    few_examples: int = field(
        default=FEW_EXAMPLES,
        metadata={
            "help": "a job that tunes the reader on at most this many examples tunes all the encoder's "
            "layers in full instead, kept as their change at rank 32, at lr 2e-5 (FEW_EXAMPLES_TUNING, "
            "probe 8); 0: never, the settings here always"
        },
    )
    precision: PrecisionChoice = field(
        default="auto",
        metadata={
            "help": "the tuning's arithmetic: float32, bfloat16 (autocast; the layers and AdamW's state stay "
            "float32), or auto: bfloat16 where the device multiplies it natively (CUDA; x86 CPUs with AMX "
            "or AVX512-BF16), else float32. Embedding is float32 either way"
        },
    )

    def __post_init__(self) -> None:
        if not self.encoder:
            raise ValueError("encoder must name a registered encoder or a model folder")
        if min(self.top_layers, self.max_length, self.steps) < 1:
            raise ValueError(
                f"top_layers, max_length and steps must be at least 1, got "
                f"{self.top_layers}, {self.max_length}, {self.steps}"
            )
        if self.few_examples < 0:
            raise ValueError(f"few_examples is a count of examples, or 0 for never; got {self.few_examples}")
        if self.adapters < 0:
            raise ValueError(f"adapters is a LoRA rank, or 0 for none; got {self.adapters}")
        if self.adapters_from not in get_args(AdaptersFrom):
            choices = ", ".join(get_args(AdaptersFrom))
            raise ValueError(f"adapters_from must be one of {choices}, got {self.adapters_from!r}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be at least 2 (a positive pair), got {self.batch_size}")
        if not (self.lr > 0 and self.temperature > 0):
            raise ValueError(f"lr and temperature must be positive, got {self.lr}, {self.temperature}")
        if self.precision not in get_args(PrecisionChoice):
            choices = ", ".join(get_args(PrecisionChoice))
            raise ValueError(f"precision must be one of {choices}, got {self.precision!r}")


_SHARED: dict[tuple[str, int, int, str], SharedEncoder] = {}
_SHARED_LOCK = threading.Lock()


def shared_encoder(config: ReaderConfig, device: str | None = None) -> SharedEncoder:
    """The process's one base for `config`'s (encoder, top_layers, max_length) on `device`: every task's
    reader runs on it, so a hundred tasks hold one copy of the encoder and their own top layers. Tasks
    cut at other layers of the same encoder run on another base over the same weights (`at_cut`)."""
    resolved = resolve_device(device or default_device())
    key = (config.encoder, config.top_layers, config.max_length, resolved)
    with _SHARED_LOCK:
        if key not in _SHARED:
            same_model = [
                base
                for (encoder, _, max_length, on), base in _SHARED.items()
                if (encoder, max_length, on) == (config.encoder, config.max_length, resolved)
            ]
            if same_model:
                _SHARED[key] = same_model[0].at_cut(config.top_layers)
            else:
                _SHARED[key] = SharedEncoder.load(config, resolved)
        return _SHARED[key]


def job_tuning(config: ReaderConfig, layers: int, examples: int) -> ReaderConfig:
    """The tuning a job gives a reader of `config` on an encoder of `layers` layers when the job holds
    `examples` examples: all the layers, at FEW_EXAMPLES_TUNING, where they are at most
    `config.few_examples`; else `config` itself."""
    if examples > config.few_examples:
        return config
    return replace(config, top_layers=layers, **FEW_EXAMPLES_TUNING)


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


class SentenceReader:
    """A task's sentence reader: the shared `base` and the task's own top layers (`layers`, packed by
    `pack_state`; None: the base's own, untuned, zero bytes of its own). Three calls: `tune`, `embed`,
    `save`/`load`."""

    def __init__(
        self,
        base: SharedEncoder,
        layers: dict[str, torch.Tensor] | None = None,
        config: ReaderConfig | None = None,
        tuned_in: Precision | None = None,
    ) -> None:
        self.base = base
        self.layers = layers
        self.config = config
        self.tuned_in = tuned_in  # the arithmetic its tuning ran in (config's "auto" resolved); None: untuned

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
        returned losses are each step's. With `config.adapters`, the task owns adapters of that rank
        instead of layers: trained as LoRA, or (`adapters_from="svd"`) the layers tuned in full and kept
        as each matrix's change at that rank. Deterministic given `config.seed` on a CPU: the batches and
        the dropout are seeded, and the caller's torch RNG is left as it was."""
        self.base.serves(config)
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        names = sorted(set(labels))
        gold = np.array([names.index(label) for label in labels])
        if np.bincount(gold).max(initial=0) < 2:
            raise ValueError("tuning needs a label with at least two texts: the loss pulls pairs together")
        states = self.base.lower(texts)
        rank = config.adapters
        if rank and config.adapters_from == "lora":
            top = self.base.adapted_module(self._own_adapters(rank), rank, trainable=True)
        elif rank:  # svd: the layers in full, from the base's own with this reader's adapters merged
            top = self.base.top_module(self.base.merged_state(self._own_adapters(rank)), trainable=True)
        else:
            top = self.base.top_module(self.layers, trainable=True)
        optimizer = torch.optim.AdamW([p for p in top.parameters() if p.requires_grad], lr=config.lr)
        gold_tensor = torch.as_tensor(gold, device=self.base.device)
        losses: list[float] = []
        with _forked_rng(self.base.device):
            torch.manual_seed(config.seed)
            batches = class_balanced_batches(gold, config.batch_size, config.steps, config.seed)
            precision = resolve_precision(config.precision, self.base.device)
            for step, batch in enumerate(batches):
                with precision_context(precision, self.base.device):
                    embeddings = self.base.upper([states[i] for i in batch], top)  # (B, H)
                loss = supervised_contrastive_loss(embeddings.float(), gold_tensor[batch], config.temperature)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                if on_step is not None:
                    on_step(step, losses[-1])
        # one assignment: a concurrent `embed` reads the old layers or the new ones
        if rank and config.adapters_from == "svd":
            own = self.base.extracted_adapters(top, rank)
        else:
            own = adapter_state(top) if rank else top.state_dict()
        self.layers = pack_state(own)
        self.config, self.tuned_in = config, precision
        return losses

    def _own_adapters(self, rank: int) -> dict[str, torch.Tensor] | None:
        """The adapters a tuning with adapters of `rank` goes on from (None: fresh ones); ValueError where
        this reader owns whole layers, or adapters of another rank."""
        if self.layers is None:
            return None
        if adapter_rank(self.layers) != rank:
            raise ValueError(f"this reader's own state is not adapters of rank {rank}: tune an untuned one")
        return self.layers

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
            "tuned_in": self.tuned_in,
        }

    def copy(self) -> SentenceReader:
        """A reader of its own on the same base: tuning it leaves this one as it is."""
        return SentenceReader(self.base, self.layers, self.config, self.tuned_in)

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
        rank = adapter_rank(layers)
        own = base.top_state() if rank is None else adapter_state(base.adapted_module(None, rank))
        expected = {key: (t.shape, t.dtype) for key, t in pack_state(own).items()}
        found = {key: (t.shape, t.dtype) for key, t in layers.items()}
        if found != expected:
            what = "top layers" if rank is None else f"top layers' adapters of rank {rank}"
            raise ValueError(f"{source}: its tensors are not {base.top_layers} {what} of {base.name}")
        return cls(base, layers, config, description.get("tuned_in"))
