"""What the subcommands share: their common arguments and the objects built from them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from openbook.data import DATA_ENV, DataError, data_root
from openbook.models import default_backbone
from openbook.prompting import PromptError, Template, Verbalizer, get_preset
from openbook.word_scores import VECTORS_ABOVE, LabelScoringChoice

if TYPE_CHECKING:
    from openbook.backbone import Backbone
    from openbook.calibration import CalibrationMode
    from openbook.classifier import Classifier
    from openbook.knn import KnnConfig
    from openbook.training import TrainConfig

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
    parser.add_argument("--layer", type=int, default=-1, help="hidden layer of the slot representation")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per prompt; longer texts are cut")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--device", type=device_name, default="auto", help="cpu, cuda, cuda:N; auto: cuda when present"
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


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    from typing import get_args

    from openbook.training import (
        DEFAULT_EPOCHS,
        DEFAULT_EVAL_EVERY,
        DEFAULT_MAX_STEPS,
        DEFAULT_MIN_STEPS,
        Keep,
        Precision,
        TrainConfig,
    )

    default = TrainConfig()
    group = parser.add_argument_group(
        "training (trainable methods)",
        f"The budget: --steps or --epochs; given neither, {DEFAULT_EPOCHS:g} epochs, at least "
        f"{DEFAULT_MIN_STEPS} and at most {DEFAULT_MAX_STEPS} steps, a dev check every {DEFAULT_EVAL_EVERY} "
        "steps; on a large set, at least one epoch, its dev checks at least an epoch / patience apart.",
    )
    budget = group.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, help="most optimiser steps per run, whatever the training set")
    budget.add_argument(
        "--epochs",
        type=float,
        help="most passes over the training set instead: an epoch is ceil(N / train batch size) steps",
    )
    group.add_argument(
        "--max-steps",
        type=int,
        help=f"most optimiser steps per run, any budget (default: {DEFAULT_MAX_STEPS} with --epochs, else "
        "no cap)",
    )
    group.add_argument(
        "--min-steps",
        type=int,
        help="with --epochs: at least this many optimiser steps, however small the training set",
    )
    group.add_argument("--train-batch-size", type=int, default=default.batch_size)
    group.add_argument("--lr", type=float, default=default.lr)
    group.add_argument(
        "--eval-every",
        type=int,
        help=f"steps between dev checks (default: every epoch with --epochs, else {DEFAULT_EVAL_EVERY})",
    )
    group.add_argument(
        "--patience",
        type=int,
        default=default.patience,
        help="dev checks without gain before stopping (epochs, with --epochs and its checks)",
    )
    group.add_argument("--reembed-every", type=int, help="steps between store re-embeddings (default: epoch)")
    group.add_argument(
        "--train-precision",
        choices=get_args(Precision),
        default=default.precision,
        help="bfloat16: mixed precision (autocast; the weights and optimiser stay float32)",
    )
    group.add_argument(
        "--keep",
        choices=get_args(Keep),
        default=default.keep,
        help="last (the default): run the budget and keep the last weights; best: the dev checks keep the "
        "best weights and stop early",
    )


def train_config(args: argparse.Namespace, seed: int) -> TrainConfig:
    from openbook.training import TrainConfig

    return TrainConfig(
        steps=args.steps,
        epochs=args.epochs,
        max_steps=args.max_steps,
        min_steps=args.min_steps,
        batch_size=args.train_batch_size,
        lr=args.lr,
        eval_every=args.eval_every,
        patience=args.patience,
        reembed_every=args.reembed_every,
        seed=seed,
        precision=args.train_precision,
        keep=args.keep,
    )


def device_name(name: str) -> str:
    from openbook.devices import resolve_device

    return resolve_device(name)


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
) -> Classifier:
    """The backbone and prompt the arguments name, with an empty store (`untrained.build_classifier`).
    No label bias unless `calibration` asks for one: the commands that evaluate measure each mode's bias
    themselves, and training resets it."""
    from openbook.untrained import UNTRAINED_KNN, build_classifier

    return build_classifier(
        *load_prompt(args, task),
        knn=UNTRAINED_KNN if knn is None else knn,
        calibration=calibration,
        batch_size=args.batch_size,
        label_scoring=args.label_scoring,
    )
