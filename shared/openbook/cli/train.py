"""`openbook train`: train a method on a k-shot split and save a checkpoint (`fitting.py`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from openbook.cli.common import (
    add_data_argument,
    add_label_scoring_argument,
    add_prompt_arguments,
    add_training_arguments,
    classifier_from_args,
    train_config,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    training = commands.add_parser("train", help="train a method on a k-shot split and save a checkpoint")
    add_data_argument(training, "k-shot", "directory in the k-shot layout")
    training.add_argument("--task", required=True)
    training.add_argument("--method", required=True, help="e.g. prompt-ft, retroprompt, retroprompt/knn-loss")
    training.add_argument(
        "--seed", type=int, required=True, help="data split 16-<seed>, also the training seed"
    )
    training.add_argument("--shots", type=int, default=16)
    training.add_argument("--out", required=True, help="checkpoint directory to create")
    training.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    training.add_argument("--init", help="continue from this checkpoint (same method, same labels)")
    training.add_argument("--no-demos", action="append_const", const="demos=none", dest="options")
    for flag in ("knn-loss", "knn-infer"):  # --no-knn-loss is the default now, still accepted
        training.add_argument(f"--no-{flag}", action="append_const", const=f"no-{flag}", dest="options")
    training.add_argument("--knn-loss", action="append_const", const="knn-loss", dest="options")
    add_prompt_arguments(training)
    add_label_scoring_argument(training)
    add_training_arguments(training)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    import dataclasses

    from openbook.checkpoints import examples_sha256, load_classifier
    from openbook.data import example_labels, load_kshot
    from openbook.fitting import LabelledTexts, fit_and_save
    from openbook.methods import build_method, weights_sha256

    spec = "/".join([args.method, *(args.options or [])])
    method = build_method(spec)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists; pass --overwrite to replace it")
    splits = load_kshot(args.data, args.task, args.seed, args.shots)
    if args.init:
        base, init_method = load_classifier(args.init, device=args.device)
        if init_method.name != method.name:
            raise ValueError(f"--init checkpoint was trained with {init_method.name}, not {method.name}")
        data_labels = sorted({e.label for e in splits.train + splits.dev})
        if data_labels != sorted(base.labels):
            raise ValueError(
                f"the checkpoint's labels {sorted(base.labels)} differ from the data's labels {data_labels}"
            )
    else:
        base = classifier_from_args(args, args.task)
    base_sha = (
        weights_sha256(base.backbone.model)
        if not args.init  # the loaded checkpoint was verified: its manifest names the base weights
        else json.loads((Path(args.init) / "manifest.json").read_text())["backbone"]["weights_sha256"]
    )
    classifier = method.prepare(dataclasses.replace(base, store=base.empty_store(), label_bias=None))
    fitted = fit_and_save(
        out,
        classifier,
        method,
        LabelledTexts([e.text for e in splits.train], example_labels(classifier, splits.train)),
        LabelledTexts([e.text for e in splits.dev], example_labels(classifier, splits.dev)),
        train_config(args, args.seed),
        base_weights_sha256=base_sha,
        training_data_sha256=examples_sha256(splits.train),
        overwrite=args.overwrite,
    )
    print(
        json.dumps(
            {
                "checkpoint": str(fitted.path),
                "method": method.spec,
                "dev": fitted.dev_metrics,
                "seconds": fitted.result.seconds,
            }
        )
    )
