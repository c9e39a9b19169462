"""`python -m research knn-selection`: a nested dev-only check of the rules that choose kNN
interpolation's settings."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from openbook.calibration import CALIBRATION_MODES
from openbook.cli.common import (
    add_data_argument,
    add_label_scoring_argument,
    add_prompt_arguments,
    add_training_arguments,
    classifier_from_args,
    train_config,
)

from research import PROG
from research.cli.settings import checked_settings

if TYPE_CHECKING:
    from openbook.classifier import Classifier

    from research.experiments.knn_selection import SeedEmbeddings


def add_parser(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "knn-selection",
        help="nested dev-only check of the rules that choose kNN interpolation's k, T and lambda",
        description="Each seed's dev set is split into stratified halves; each rule chooses on one half "
        "(and, if it uses them, the training examples scored leave-one-out) and is scored on the other. "
        "Test files are never read.",
    )
    add_data_argument(check, "k-shot", "directory in the k-shot layout")
    check.add_argument("--task", default="SST-2,trec,mpqa,sst-5", help="tasks, separated by commas")
    check.add_argument("--seeds", default="13,21,42,87,100")
    check.add_argument("--shots", type=int, default=16)
    check.add_argument("--splits", type=int, default=10, help="random dev half-splits per seed")
    check.add_argument("--calibration", choices=CALIBRATION_MODES, default="domain", help="frozen prompt's")
    check.add_argument(
        "--trained",
        help="train this method on each seed first and check its classifier (e.g. retroprompt); "
        "default: the frozen prompt",
    )
    check.add_argument("--out", required=True, help="directory for the cached embeddings and the table")
    add_prompt_arguments(check)
    add_label_scoring_argument(check)
    add_training_arguments(check)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.atomic import write_text
    from openbook.data import load_train_dev
    from openbook.methods import build_method

    from research.experiments.knn_selection import (
        TrainedSetup,
        cached_embeddings,
        check_table,
        embed_seed,
        run_check,
        write_records,
    )

    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.splits < 1:
        raise ValueError(f"--splits must be at least 1, got {args.splits}")
    method = build_method(args.trained) if args.trained else None  # an unknown method fails first
    data = {(t, s): load_train_dev(args.data, t, s, args.shots) for t in tasks for s in seeds}
    out = Path(args.out)
    settings = checked_settings(args, {"trained": args.trained})
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "settings.json", json.dumps(settings, indent=2) + "\n")
    classifiers: dict[str, tuple[Classifier, dict]] = {}  # task -> (classifier, its initial weights)

    def embed(task: str, seed: int) -> SeedEmbeddings:
        if task not in classifiers:
            classifier = classifier_from_args(args, task)
            weights = classifier.backbone.model.state_dict()
            classifiers[task] = (
                classifier,
                {n: t.detach().clone() for n, t in weights.items()} if method else {},
            )
        classifier, initial = classifiers[task]
        if method is None:
            return embed_seed(classifier, *data[task, seed], calibration=args.calibration)
        try:
            trained = TrainedSetup(method, train_config(args, seed))
            return embed_seed(classifier, *data[task, seed], trained=trained)
        finally:
            classifier.backbone.model.load_state_dict(initial)  # every seed trains from the same start

    def embeddings_of(task: str, seed: int) -> SeedEmbeddings:
        return cached_embeddings(out / "embeddings" / f"{task}-{seed}.npz", lambda: embed(task, seed))

    records = run_check(tasks, seeds, embeddings_of, splits=args.splits)
    write_records(records, out)
    table = (
        f"# Nested dev-only check of kNN-interpolation selection rules, seeds {args.seeds}, "
        f"backbone {args.backbone}, {'trained: ' + args.trained if args.trained else 'frozen prompt'}\n\n"
        f"Held-out dev accuracy in %, {args.splits} stratified half-splits per seed, both ways round.\n\n"
        f"Command: `{PROG} {shlex.join(argv)}`\n\n" + check_table(records)
    )
    write_text(out / "results.md", table)
    print(table)
