"""What every trainable prompt method provides, and the registry that names them.

A method is a small config dataclass plus a `Method` subclass that says which
parameters train, what the loss is, and how inference reads the result. The
training loop (`openbook.training`) and the checkpoints (`openbook.checkpoints`)
only talk to this interface, so adding a method is adding one module.

A method spec on the command line is the method's name followed by `/option`s:
`retroprompt/no-knn-infer` sets the boolean field `knn_infer` to False, and
`retroprompt/contrastive=0.5` sets a field to a value. Specs are written in one
canonical spelling: every option off its default, in field order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.demonstrations import DemoConfig
from openbook.prompting import Template, TextInput, Verbalizer

Inference = Literal["zero-shot", "knn-interp"]


class MethodError(ValueError):
    """A method name or option that does not exist, or does not fit the backbone."""


@dataclass(frozen=True)
class MethodConfig:
    # Fields that change only how a trained model predicts: runs differing in them share one training.
    INFERENCE_ONLY: ClassVar[tuple[str, ...]] = ()

    def training_key(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, v) for k, v in dataclasses.asdict(self).items() if k not in self.INFERENCE_ONLY)


@dataclass
class TrainBatch:
    texts: Sequence[TextInput]
    gold: torch.Tensor  # (B,) label indices
    ids: np.ndarray  # (B,) the examples' ids in the classifier's store


class Method(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `python -m research methods`
    config_class: ClassVar[type[MethodConfig]]
    # Whether training changes the backbone's own weights. Every method says so (a class attribute, or
    # set in __init__ where an option decides); a method that does not shares one loaded backbone
    # with every other such task, and its checkpoint holds only its own tensors.
    updates_backbone: bool

    def __init__(self, config: MethodConfig | None = None) -> None:
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, self.config_class):
            raise MethodError(
                f"{self.name} takes a {self.config_class.__name__}, got {type(self.config).__name__}"
            )

    @property
    def spec(self) -> str:
        """The method's name plus every option off its default, e.g. `retroprompt/contrastive=0.5`."""
        return config_spec(self.name, self.config)

    def check_backbone(self, backbone: Backbone) -> None:
        """Raise MethodError when an option cannot work on this backbone."""
        return None  # every option fits by default

    def demo_config(self) -> DemoConfig | None:
        """The demonstrations the method's classifier shows (`prepare` switches them on); None: none."""
        return None

    @property
    def uses_store_in_training(self) -> bool:
        """Whether the loss reads the store: if so, training re-embeds it on a schedule
        (`TrainConfig.reembed_every`), so that what the loss reads follows the weights."""
        return False

    def prepare(self, classifier: Classifier) -> Classifier:
        """The classifier this method trains and predicts with (e.g. with demonstrations switched on)."""
        self.check_backbone(classifier.backbone)
        return classifier

    @property
    @abstractmethod
    def inference(self) -> Inference: ...

    @abstractmethod
    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]: ...

    def parameter_groups(self, classifier: Classifier, lr: float) -> list[dict[str, Any]]:
        """AdamW parameter groups; a method whose prompt vectors want their own learning rate overrides this.

        Every parameter here must also be in `trainable_parameters`.
        """
        return [{"params": self.trainable_parameters(classifier), "lr": lr}]

    @abstractmethod
    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        """Everything training changed, as named tensors: what a checkpoint stores."""

    def checkpoint_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        """What a checkpoint stores: `trained_tensors`, in the precision they are written in."""
        return self.trained_tensors(classifier)

    @abstractmethod
    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def loss(self, classifier: Classifier, batch: TrainBatch) -> torch.Tensor: ...


def check_prompt_fits(backbone: Backbone, template: Template, verbalizer: Verbalizer, method: Method) -> None:
    """Raise PromptError where `method`'s prompt would leave no room for the input on `backbone`.

    The plain prompt must fit, and with demonstrations, the template beside at least one class's (a task
    with many labels shows fewer classes than it has where their pairs do not all fit: `PromptEncoder`).
    Pure: it tokenizes the template and the label words, and changes nothing; a service calls it where a
    task is created or its labels change, so a prompt that cannot work is refused before it is stored.
    """
    backbone.encoder(template, verbalizer)
    demos = method.demo_config()
    if demos is not None:
        backbone.encoder(template, verbalizer, demonstrations=demos.layout, demo_classes=demos.classes)


def calibrated_logits(classifier: Classifier, log_probs: torch.Tensor) -> torch.Tensor:
    """Label scores minus the classifier's fixed log-prior: the logits the cross-entropy sees."""
    if classifier.label_bias is None:
        return log_probs
    return log_probs - torch.from_numpy(classifier.label_bias).to(log_probs.device)


def prompt_cross_entropy(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """(B,) cross-entropy over the label words only, as in LM-BFF."""
    return F.cross_entropy(logits, gold.to(logits.device), reduction="none")


@dataclass(frozen=True)
class EmbeddingOptions:
    """Whether full fine-tuning trains the token-embedding table.

    The table (and the LM head, where it is tied to the table) is most of a small multilingual
    backbone: 168M of `gemma3-270m`'s 268M weights, against 28M of `smollm2-135m`'s 135M. Scoring a
    label as log-softmax over the whole vocabulary gives every row of a tied head a gradient at every
    step, so training it costs a dense vocabulary-by-hidden gradient, its clipping and its AdamW
    moments, whatever the batch.
    """

    # True: every other weight trains, and the table stays as loaded. The default since a dev check
    # (docs/experiments/training-step-and-embedding-table.md, "The token-embedding table, chosen on
    # dev"): on gemma3-270m, retroprompt's dev mean 77.4 against 77.0 with the table trained, at half the
    # seconds per step.
    freeze_embeddings: bool = True


class FullFineTuning(Method):
    """Every backbone weight trains (but the token-embedding table under `freeze_embeddings`); tied
    weights (input embedding = LM head) are stored once.

    Its checkpoints hold the whole backbone, or all of it but a frozen table, which loading finds in
    the base weights (`checkpoints.load_classifier` checks their hash first). They are written in half
    precision (`half_precision`): half the disk, and `load_trained` copies them back into the model's
    own dtype.
    """

    updates_backbone = True

    def _frozen_table(self, classifier: Classifier) -> torch.Tensor | None:
        if not (isinstance(self.config, EmbeddingOptions) and self.config.freeze_embeddings):
            return None
        table = classifier.backbone.model.get_input_embeddings().weight
        assert isinstance(table, torch.Tensor)
        return table

    def trainable_parameters(self, classifier: Classifier) -> list[nn.Parameter]:
        table = self._frozen_table(classifier)
        return [p for p in classifier.backbone.model.parameters() if p.requires_grad and p is not table]

    def trained_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        table = self._frozen_table(classifier)
        seen = set() if table is None else {table.data_ptr()}  # a frozen table is the base's: not stored
        tensors = {}
        for name, tensor in classifier.backbone.model.state_dict().items():
            if tensor.data_ptr() not in seen:  # a tied weight appears under two names
                seen.add(tensor.data_ptr())
                tensors[name] = tensor
        return tensors

    def checkpoint_tensors(self, classifier: Classifier) -> dict[str, torch.Tensor]:
        return half_precision(self.trained_tensors(classifier))

    def load_trained(self, classifier: Classifier, tensors: dict[str, torch.Tensor]) -> None:
        model = classifier.backbone.model
        missing, unexpected = model.load_state_dict(tensors, strict=False)  # copied into the model's dtype
        kept = _tied_aliases(model)  # names whose tensor another name stores
        table = self._frozen_table(classifier)
        if table is not None:  # the frozen table, under each of its names, stays as loaded
            kept |= {name for name, t in model.state_dict().items() if t.data_ptr() == table.data_ptr()}
        if unexpected or any(name not in kept for name in missing):
            raise MethodError(
                "checkpoint weights do not fit the backbone: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )


def half_precision(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """float32 tensors as float16, other dtypes as they are.

    float16 rather than bfloat16: it keeps 10 mantissa bits to bfloat16's 7, so a reloaded model predicts
    closer to the trained one, and fine-tuned LM weights lie far inside its range (65504). A tensor that
    does leave that range is written in bfloat16, which has float32's range, instead of overflowing.
    """
    halved = {}
    for name, tensor in tensors.items():
        if tensor.dtype == torch.float32:
            half = tensor.to(torch.float16)
            overflows = not torch.isfinite(half).all() and torch.isfinite(tensor).all()
            tensor = tensor.to(torch.bfloat16) if overflows else half
        halved[name] = tensor
    return halved


def _tied_aliases(model: nn.Module) -> set[str]:
    """Names in the state dict that share storage with an earlier name."""
    seen: set[int] = set()
    aliases = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            aliases.add(name)
        seen.add(tensor.data_ptr())
    return aliases


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the names and bytes of every tensor in the state dict: identifies the base weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


METHODS: dict[str, type[Method]] = {}
# What a task, `openbook.create_classifier` and the benches train when no method is named.
DEFAULT_METHOD = "retroprompt"


def register_method(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def build_method(spec: str) -> Method:
    """`retroprompt/knn-loss` -> a configured Method; unknown names and options raise MethodError."""
    name = spec.split("/")[0].strip()
    if name not in METHODS:
        raise MethodError(f"unknown method {name!r}; registered: {', '.join(sorted(METHODS))}")
    cls = METHODS[name]
    return cls(config_from_options(spec, cls.config_class))


def config_from_options(spec: str, config_class: type[Any]) -> Any:
    """The config dataclass that `spec` (`name/option/key=value...`) asks for, every other field at its
    default: `flag` / `no-flag` set a boolean field, `key=value` any other, converted to the default's
    type. MethodError for an unknown option, a value of the wrong type, or a config that refuses the
    values."""
    name, *options = [part.strip() for part in spec.split("/")]
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {}
    for option in options:
        key, sep, raw = option.partition("=")
        negated = not sep and key.startswith("no-")
        field_name = (key[3:] if negated else key).replace("-", "_")
        field = fields.get(field_name)
        if field is None:
            known = ", ".join(n.replace("_", "-") for n in fields) or "none"
            raise MethodError(f"method {name} has no option {key!r} (options: {known})")
        default = getattr(config_class(), field_name)
        if not sep:
            if not isinstance(default, bool):
                raise MethodError(f"option {field_name!r} of {name} needs a value: {key}=...")
            values[field_name] = not negated
        else:
            values[field_name] = _convert(raw, default, f"{name}/{option}")
    try:
        return config_class(**values)
    except (TypeError, ValueError) as error:
        raise MethodError(f"{spec}: {error}") from None


def config_spec(name: str, config: Any) -> str:
    """`name` plus every field of the dataclass `config` that differs from its default, spelled as
    `config_from_options` reads it back, e.g. `retroprompt/contrastive=0.5`."""
    default = type(config)()
    options = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value != getattr(default, field.name):
            key = field.name.replace("_", "-")
            options.append(f"no-{key}" if value is False else key if value is True else f"{key}={value}")
    return "/".join([name, *options])


def method_config(spec: str) -> dict[str, Any]:
    """The method `spec` names with every option, defaults included, as JSON reads it back: what a
    record keeps so that it still says what ran after a default changes."""
    method = build_method(spec)
    return json.loads(json.dumps({"name": method.name, **dataclasses.asdict(method.config)}))


def recorded_spec(recorded: dict[str, Any]) -> str:
    """The spec that names a record's `method_config` under today's defaults: once a default changes,
    the name its run goes by (a `retroprompt` run recorded with neural demonstrations is
    `retroprompt/demos=neural` once none are the default). MethodError where the recorded
    options no longer make a config."""
    options = dict(recorded)
    cls = METHODS[options.pop("name")]
    try:  # JSON gave lists where the config holds tuples
        config = cls.config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
    except (TypeError, ValueError) as error:
        raise MethodError(
            f"{recorded['name']}: recorded options {options} make no config now: {error}"
        ) from None
    return cls(config).spec


def _convert(raw: str, default: Any, where: str) -> Any:
    converters: dict[type, Callable[[str], Any]] = {
        bool: lambda s: {"true": True, "false": False}[s.lower()],
        int: int,
        float: float,
        str: str,
    }
    try:
        return converters[type(default)](raw)
    except (KeyError, ValueError):
        raise MethodError(f"{where}: {raw!r} is not a valid {type(default).__name__}") from None


@contextmanager
def only_these_train(classifier: Classifier, parameters: list[torch.nn.Parameter]) -> Iterator[None]:
    """Gradients for `parameters` alone (no backward work for frozen weights); restored afterwards."""
    modules = [classifier.backbone.model] + ([classifier.prompt] if classifier.prompt is not None else [])
    everything = [p for module in modules for p in module.parameters()]
    before = [p.requires_grad for p in everything]
    chosen = {id(p) for p in parameters}
    for p in everything:
        p.requires_grad_(id(p) in chosen)
    try:
        yield
    finally:
        for p, flag in zip(everything, before, strict=True):
            p.requires_grad_(flag)
