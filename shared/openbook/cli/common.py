"""What the subcommands share: their common arguments and the objects built from them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from openbook.backbone import BackboneConfig
from openbook.classifier import Classifier
from openbook.config_fields import add_field_arguments, field_values, help_of
from openbook.data import DATA_ENV, DataError, data_root
from openbook.knn import KnnConfig
from openbook.models import default_backbone
from openbook.prompting import PromptError, Template, Verbalizer, get_preset
from openbook.train_config import DEFAULT_EPOCHS, DEFAULT_MAX_STEPS, DEFAULT_MIN_STEPS, TrainConfig
from openbook.word_scores import VECTORS_ABOVE, LabelScoringChoice

if TYPE_CHECKING:
    from openbook.backbone import Backbone
    from openbook.calibration import CalibrationMode
    from openbook.sentence_reader import ReaderConfig

# Errors that are the user's to fix: printed in one line, exit status 2 (MethodError and
# CheckpointError are ValueErrors; the OSErrors are paths that cannot be read or written as named,
# such as an --out that is a file).
USER_ERRORS = (
    PromptError,
    DataError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def add_data_argument(parser: argparse.ArgumentParser, layout: str | None, help: str) -> None:
    """--data, whose default is `$OPENBOOK_DATA/<layout>` (the root itself when `layout` is None)."""
    parser.add_argument("--data", help=f"{help} (default: ${DATA_ENV}/{layout or ''})")
    parser.set_defaults(data_layout=layout)


def data_dir(args: argparse.Namespace) -> str:
    if args.data:
        return args.data
    layout = "full" if getattr(args, "full", False) else args.data_layout  # the lab's eval --full reads full/
    return str(data_root() / layout) if layout else str(data_root())


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backbone",
        default=default_backbone(),
        help="registered name, local path or hub id ($OPENBOOK_DEFAULT_BACKBONE)",
    )
    parser.add_argument("--template", help="e.g. '{text} It was {mask}' (default: the task's preset)")
    parser.add_argument(
        "--labels",
        help="label=word pairs, e.g. '0=terrible,1=great', or label names alone, e.g. "
        "'book_flight,transfer', each scored by its readable word ('book flight') (default: preset)",
    )
    add_field_arguments(parser, BackboneConfig, ("layer", "max_length"))
    parser.add_argument(
        "--batch-size",
        type=int,
        default=Classifier.batch_size,
        help="texts per forward (default: %(default)s)",
    )
    add_device_argument(parser)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """--device, BackboneConfig's default ($OPENBOOK_DEVICE, else auto), resolved as the arguments are
    parsed (auto is named as the device it is here): building the parser reads no setting, so a bad
    $OPENBOOK_DEVICE fails only a command that takes --device, in one line."""
    from openbook.devices import DEFAULT_DEVICE, DEVICE_ENV

    parser.add_argument(
        "--device",
        type=device_name,
        default=os.environ.get(DEVICE_ENV) or DEFAULT_DEVICE,
        help=help_of(BackboneConfig, "device") + " (default: %(default)s)",
    )


def add_label_scoring_argument(parser: argparse.ArgumentParser) -> None:
    """--label-scoring: how P_LM scores the label words (see openbook/word_scores.py)."""
    parser.add_argument(
        "--label-scoring",
        choices=get_args(LabelScoringChoice),
        default="auto",
        help="exact: log P(word | prompt) over every token of a multi-token word; vectors: label vectors in "
        "the slot's space (the mean of the word's LM-head rows), one product, cheaper for many long words; "
        f"auto (default): exact up to {VECTORS_ABOVE} labels, vectors above",
    )


# The TrainConfig fields the commands set: the budget (one or the other) and the knobs, under their
# fields' names, except where the prompt's flags have the name already.
BUDGET_FIELDS = ("steps", "epochs")
TRAIN_FIELDS = (
    "max_steps",
    "min_steps",
    "batch_size",
    "lr",
    "eval_every",
    "patience",
    "reembed_every",
    "precision",
    "keep",
    "few_dev_lam",
)
TRAIN_FLAGS = {"batch_size": "train-batch-size", "precision": "train-precision"}


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """TrainConfig's fields that a command sets (`train_config` reads them back), defaults and help
    TrainConfig's."""
    group = parser.add_argument_group(
        "training (trainable methods)",
        f"The budget: --steps or --epochs; given neither, {DEFAULT_EPOCHS:g} epochs of at least "
        f"{DEFAULT_MIN_STEPS} and at most {DEFAULT_MAX_STEPS} steps.",
    )
    add_field_arguments(group.add_mutually_exclusive_group(), TrainConfig, BUDGET_FIELDS)
    add_field_arguments(group, TrainConfig, TRAIN_FIELDS, flags=TRAIN_FLAGS)


def train_config(args: argparse.Namespace, seed: int) -> TrainConfig:
    return TrainConfig(**field_values(args, (*BUDGET_FIELDS, *TRAIN_FIELDS), flags=TRAIN_FLAGS), seed=seed)


def device_name(name: str) -> str:
    from openbook.devices import resolve_device

    try:
        return resolve_device(name)
    except ValueError as error:  # argparse's one line: "argument --device: unknown device ..."
        raise argparse.ArgumentTypeError(str(error)) from None


def prompt_for(
    task: str | None, template: str | None, labels: str | None, kind: str, task_dir: Path | None = None
) -> tuple[Template, Verbalizer]:
    """The template and labels given, else the task's preset (whose labels may be in `task_dir`)."""
    if template and labels:
        return Template(template), Verbalizer.parse(labels)
    if task is None:
        raise PromptError("give --task with a preset, or both --template and --labels")
    preset = get_preset(task)
    return (Template(template) if template else preset.template(kind)), (
        Verbalizer.parse(labels) if labels else preset.verbalizer(kind, task_dir)
    )


def task_dir(args: argparse.Namespace, task: str | None) -> Path | None:
    """The task's data folder, for a preset whose labels are in its data; None without one."""
    if task is None or not hasattr(args, "data_layout") or getattr(args, "full", False):
        return None
    if args.data is None and DATA_ENV not in os.environ:
        return None
    return Path(data_dir(args)) / task


def load_prompt(args: argparse.Namespace, task: str | None) -> tuple[Backbone, Template, Verbalizer]:
    """The backbone the arguments name, loaded, and the prompt they name for it."""
    from openbook.backbone import BackboneConfig, load_backbone

    backbone = load_backbone(
        BackboneConfig(name=args.backbone, layer=args.layer, max_length=args.max_length, device=args.device)
    )
    return backbone, *prompt_for(task, args.template, args.labels, backbone.kind, task_dir(args, task))


def classifier_from_args(
    args: argparse.Namespace,
    task: str | None,
    *,
    knn: KnnConfig | None = None,
    calibration: CalibrationMode = "none",
    reader: str | ReaderConfig | None = None,
) -> Classifier:
    """The backbone and prompt the arguments name, with an empty store (`untrained.build_classifier`).
    No label bias unless `calibration` asks for one: the commands that evaluate measure each mode's bias
    themselves, and training resets it. `reader`: a sentence encoder that keys the book (`classifier.py`)."""
    from openbook.sentence_reader import untuned_reader
    from openbook.untrained import UNTRAINED_KNN, build_classifier

    backbone, template, verbalizer = load_prompt(args, task)
    return build_classifier(
        backbone,
        template,
        verbalizer,
        knn=UNTRAINED_KNN if knn is None else knn,
        calibration=calibration,
        batch_size=args.batch_size,
        label_scoring=args.label_scoring,
        reader=None if reader is None else untuned_reader(reader, str(backbone.device)),
    )
