"""`openbook train`: train a method on a k-shot split and save a checkpoint.

It trains through the library's one fit pipeline (`Estimator.fit` and `.save`, `fitting.py`), as the
service's trainer and a library user do: the k-shot dev is given apart (it chooses and calibrates, and is
not stored), and `--init` trains a loaded checkpoint on, its manifest's base weights named as its own.
"""

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
    training.add_argument("--no-knn-infer", action="append_const", const="no-knn-infer", dest="options")
    training.add_argument("--knn-loss", action="append_const", const="knn-loss", dest="options")
    training.add_argument(
        "--reader",
        help="the sentence encoder that keys the book (mpnet, or a sentence-transformers folder): tuned on"
        " the training examples first, its neighbours are P_kNN (default: $OPENBOOK_DEFAULT_READER, else"
        " mpnet; none: the slot vectors key it; not with --init: a checkpoint keeps its own)",
    )
    add_prompt_arguments(training)
    add_label_scoring_argument(training)
    add_training_arguments(training)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    import dataclasses

    from openbook.data import example_labels, load_kshot
    from openbook.encoders import chosen_reader
    from openbook.estimator import Estimator, load
    from openbook.methods import build_method

    spec = "/".join([args.method, *(args.options or [])])
    method = build_method(spec)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists; pass --overwrite to replace it")
    splits = load_kshot(args.data, args.task, args.seed, args.shots)
    if args.init and args.reader:
        raise ValueError("--init trains a checkpoint on with the reader it has: drop --reader")
    if args.init:
        loaded = load(args.init, device=args.device)  # verified: its manifest names the base weights
        if loaded.method.name != method.name:
            raise ValueError(f"--init checkpoint was trained with {loaded.method.name}, not {method.name}")
        data_labels = sorted({e.label for e in splits.train + splits.dev})
        if data_labels != sorted(loaded.labels):
            raise ValueError(
                f"the checkpoint's labels {sorted(loaded.labels)} differ from the data's labels {data_labels}"
            )
        assert loaded.record is not None
        estimator = Estimator(
            loaded.classifier, method, base_weights_sha256=loaded.record.base_weights_sha256
        )
    else:
        reader = chosen_reader(args.reader)
        estimator = Estimator(classifier_from_args(args, args.task, reader=reader), method)
    example_labels(estimator.classifier, splits.train + splits.dev)  # an unknown label names its line
    report = estimator.fit(
        [e.text for e in splits.train],
        [e.label for e in splits.train],
        dev=([e.text for e in splits.dev], [e.label for e in splits.dev]),
        progress=True,
        **dataclasses.asdict(train_config(args, args.seed)),
    )
    path = estimator.save(out, overwrite=args.overwrite)
    print(
        json.dumps(
            {
                "checkpoint": str(path),
                "method": method.spec,
                "dev": report.dev_metrics,
                "seconds": report.result.seconds,
            }
        )
    )
