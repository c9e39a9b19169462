"""`python -m research continual`: a class-incremental sequence of k-shot tasks (see
`experiments/continual.py`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from openbook.cli.common import (
    add_data_argument,
    add_prompt_arguments,
    add_training_arguments,
    train_config,
)
from openbook.prompting import Template

from research import PROG
from research.cli.settings import checked_settings, knn_settings


def add_parser(commands: argparse._SubParsersAction) -> None:
    continual = commands.add_parser(
        "continual",
        help="class-incremental sequence of k-shot tasks: average accuracy and forgetting",
        description="Here --template is one template for every stage (default: the continual module's) "
        "and --labels gives task:label=word pairs over the built-in words, e.g. 'SST-2:0=bad,SST-2:1=good'.",
    )
    add_data_argument(continual, "k-shot", "directory in the k-shot layout")
    continual.add_argument("--stages", default="SST-2,trec,mpqa", help="tasks in the order they arrive")
    continual.add_argument("--methods", default="l2p,prompt-ft,retroprompt", help="trainable methods")
    continual.add_argument("--seeds", default="13")
    continual.add_argument("--shots", type=int, default=16)
    continual.add_argument("--test-size", type=int, default=300, help="fixed test sample per stage")
    continual.add_argument("--calibration", choices=["none", "domain"], default="none")
    continual.add_argument("--out", required=True, help="results directory; runs already in it are skipped")
    add_prompt_arguments(continual)
    add_training_arguments(continual)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.knn import DEFAULT_KNN
    from openbook.methods import build_method

    from research.experiments import continual
    from research.experiments.reports import locked

    stages = continual.build_stages(
        [t.strip() for t in args.stages.split(",") if t.strip()], continual.parse_stage_words(args.labels)
    )
    specs = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    for spec in specs:
        build_method(spec)  # unknown methods and unreadable data fail before any model is loaded
    for seed in seeds:
        continual.load_stage_data(args.data, stages, seed, args.shots, args.test_size)
    # the stages' kNN scoring is the library's default (experiments.continual passes no other)
    settings = checked_settings(args, knn_settings(DEFAULT_KNN)) | {
        "stages": [s.task for s in stages],
        "test_size": args.test_size,
    }
    records = continual.read_continual_results(args.out)
    if any(r.stages != settings["stages"] or r.test_size != args.test_size for r in records):
        raise ValueError(f"{args.out} holds runs over other stages or test sizes; use another --out")
    header = (
        f"# Continual learning, {' -> '.join(settings['stages'])}\n\n"
        "Average accuracy and forgetting in %, mean (std) over seeds.\n\n"
        f"Command: `{PROG} {shlex.join(argv)}`\n\n"
    )

    def save(record: continual.ContinualRecord) -> None:
        with locked(args.out):  # other processes may share --out, running other methods or seeds
            continual.add_continual_record(record, args.out, header)
            (Path(args.out) / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")

    backbone = load_backbone(
        BackboneConfig(name=args.backbone, layer=args.layer, max_length=args.max_length, device=args.device)
    )
    continual.run_continual(
        backbone,
        args.data,
        stages,
        specs,
        seeds,
        dataclasses.replace(train_config(args, seeds[0]), calibration=args.calibration),
        template=Template(args.template or continual.DEFAULT_TEMPLATE),
        shots=args.shots,
        test_size=args.test_size,
        batch_size=args.batch_size,
        done={(r.method, r.seed) for r in records},
        on_record=save,
    )
    print(continual.continual_table(continual.read_continual_results(args.out)))
