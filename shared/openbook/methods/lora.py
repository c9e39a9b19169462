"""LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022) on a shared backbone.

A frozen weight W of a projection gets a trainable low-rank update,

    h = W x + (alpha / r) * B A x        # A: (r, in), B: (out, r), B starts at zero

so training moves r * (in + out) numbers per projection instead of in * out,
and the untrained adapter leaves the backbone's answer unchanged. The `peft`
library builds the adapter layers (`inject_adapter_in_model`).

`lora` trains them on prompt-based fine-tuning's objective (cross-entropy
over the label words at the slot, as `prompt-ft`); `retroprompt/backbone=lora`
trains them on RetroPrompt's (see `retroprompt.py`). Both go through
`TrainsLora`, which swaps the backbone's training for the adapters'.

**Sharing the base.** peft injects adapter layers into the module tree it is
given, in place. Injected into a backbone that other tasks read, they would
change what those tasks compute (and the base's state_dict names, which every
checkpoint's base-weights check reads). So each adapted classifier gets its
own copy of the module tree whose parameters and buffers are the *same
tensors* as the base's (no weight is copied: a few MB of Python objects per
task, measured by `openbook bench tasks`), and peft injects into that copy.
Two tasks on one backbone thus run side by side, each through its own
adapters, with no lock between them and the base module untouched.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods.base import FullFineTuning, MethodConfig, MethodError, register_method
from openbook.methods.prompt_ft import PromptFT

if TYPE_CHECKING:
    from transformers import PreTrainedModel

INIT_SEED = 0  # A's random init does not depend on the caller's RNG state
TARGET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class LoraOptions:
    """LoRA's settings: options of `lora`, and of `retroprompt` with backbone=lora."""

    r: int = 8  # rank of each update
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.0  # on the adapter's input, in training only
    # default: peft's choice for the architecture (the query and value projections, as Hu et al.:
    # q_proj,v_proj on Llama/SmolLM2, query,value on BERT); all-linear: every linear layer but the
    # LM head; or the projections' names, comma-separated (q_proj,k_proj,v_proj,o_proj)
    targets: str = "default"
    lora_lr: float = 5e-4  # the adapters' learning rate (the loop's --lr is for full fine-tuning)

    def check_lora(self) -> None:
        if self.r < 1 or not self.alpha > 0:
            raise ValueError(f"r must be at least 1 and alpha positive, got r={self.r}, alpha={self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.lora_lr > 0:
            raise ValueError(f"lora_lr must be positive, got {self.lora_lr}")
        if self.targets not in ("default", "all-linear"):
            names = self.targets.split(",")
            if not all(TARGET_NAME.fullmatch(name) for name in names):
                raise ValueError(
                    f"targets must be default, all-linear or comma-separated names, got {self.targets!r}"
                )


@dataclass(frozen=True)
class LoraMethodConfig(MethodConfig, LoraOptions):
    def __post_init__(self) -> None:
        self.check_lora()


def target_modules(options: LoraOptions, model: PreTrainedModel) -> str | list[str]:
    """What peft should adapt in `model`; MethodError if the names fit none of its layers."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if options.targets == "all-linear":
        return "all-linear"
    head = model.get_output_embeddings()
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    linear -= {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if m is head}
    if options.targets == "default":
        model_type = model.config.model_type
        if model_type not in DEFAULTS:
            raise MethodError(
                f"peft has no default LoRA targets for {model_type!r}: name them, e.g. "
                f"targets={','.join(sorted(linear)[:4])} (its linear layers: {', '.join(sorted(linear))})"
            )
        return list(DEFAULTS[model_type])
    names = options.targets.split(",")
    missing = [name for name in names if name not in linear]
    if missing:
        raise MethodError(
            f"LoRA targets {', '.join(missing)} are not linear layers of this backbone "
            f"(its linear layers: {', '.join(sorted(linear))})"
        )
    return names


def adapted_backbone(backbone: Backbone, options: LoraOptions) -> Backbone:
    """A backbone reading `backbone`'s weights through fresh LoRA adapters of its own; `backbone` stays as is.

    The copied module tree holds new `Parameter` objects over the base's storage, so freezing them,
    casting them for training (`float32_weights`) or switching train/eval mode never reaches the base.
    """
    import peft

    model = backbone.model
    memo: dict[int, Any] = {id(p): nn.Parameter(p.data, requires_grad=False) for p in model.parameters()}
    memo.update({id(b): b for b in model.buffers()})  # rotary tables, position ids: read-only, shared
    tree = copy.deepcopy(model, memo)
    config = peft.LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,  # type: ignore[arg-type]  # peft annotates int, but only divides by it
        lora_dropout=options.dropout,
        target_modules=target_modules(options, model),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        # peft adapts `tree` in place and returns it: still the transformers model that was copied.
        adapted = cast("PreTrainedModel", peft.inject_adapter_in_model(config, tree))
    return Backbone(adapted, backbone.tokenizer, backbone.kind, backbone.config)


def adapter_parameters(backbone: Backbone) -> dict[str, nn.Parameter]:
    return {name: p for name, p in backbone.model.named_parameters() if "lora_" in name}


class LoraAdapters:
    """How a method trains, saves and loads LoRA adapters in place of the backbone's weights."""

    def __init__(self, options: LoraOptions) -> None:
        self.options = options

    def check_backbone(self, backbone: Backbone) -> None:
        target_modules(self.options, backbone.model)

    def attach(self, classifier: Classifier) -> Classifier:
        if adapter_parameters(classifier.backbone):  # a loaded checkpoint's (`openbook train --init`): go on
            return classifier
        return dataclasses.replace(classifier, backbone=adapted_backbone(classifier.backbone, self.options))

    def parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        found = list(adapter_parameters(classifier.backbone).values())
        if not found:
            raise MethodError("this classifier has no LoRA adapters: prepare it with its method")
        return found

    def tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in adapter_parameters(classifier.backbone).items()}

    def load(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        own = adapter_parameters(classifier.backbone)
        wrong = [n for n in own.keys() | tensors.keys() if n not in own or n not in tensors]
        wrong += [n for n in own.keys() & tensors.keys() if own[n].shape != tensors[n].shape]
        if wrong:
            raise MethodError(f"the saved LoRA adapters do not fit this backbone: {sorted(wrong)[:5]}")
        with torch.no_grad():
            for name, parameter in own.items():
                parameter.copy_(tensors[name])


class TrainsLora(FullFineTuning):
    """A method that trains LoRA adapters instead of the backbone when its `adapters` are set.

    Put before the method's own base class (`class Lora(TrainsLora, PromptFT)`): its loss and
    prompting stay the base's, what trains and what a checkpoint holds become the adapters. Without
    adapters the base, a `FullFineTuning`, trains the backbone.
    """

    adapters: LoraAdapters | None = None

    def __init__(self, config: MethodConfig | None = None) -> None:
        super().__init__(config)
        self.adapters = self.lora_adapters()
        self.updates_backbone = self.adapters is None

    def lora_adapters(self) -> LoraAdapters | None:
        assert isinstance(self.config, LoraOptions)
        return LoraAdapters(self.config)

    def check_backbone(self, backbone: Backbone) -> None:
        super().check_backbone(backbone)
        if self.adapters is not None:
            self.adapters.check_backbone(backbone)

    def prepare(self, classifier: Classifier) -> Classifier:
        prepared = super().prepare(classifier)
        return prepared if self.adapters is None else self.adapters.attach(prepared)

    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        if self.adapters is None:
            return super().trainable_parameters(classifier)
        return self.adapters.parameters(classifier)

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict[str, Any]]:
        if self.adapters is None:
            return super().parameter_groups(classifier, lr)
        return [{"params": self.adapters.parameters(classifier), "lr": self.adapters.options.lora_lr}]

    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        if self.adapters is None:
            return super().trained_tensors(classifier)
        return self.adapters.tensors(classifier)

    def checkpoint_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        if self.adapters is None:
            return super().checkpoint_tensors(classifier)
        return self.trained_tensors(classifier)  # a few MB: kept exact, not halved as a whole backbone is

    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        if self.adapters is None:
            super().load_trained(classifier, tensors)
        else:
            self.adapters.load(classifier, tensors)


@register_method
class Lora(TrainsLora, PromptFT):
    name = "lora"
    summary = "LoRA (Hu et al.): low-rank adapters on the attention projections, prompt-ft's loss (peft)"
    config_class = LoraMethodConfig
    config: LoraMethodConfig
    updates_backbone = False
