"""`python -m research ipt-table`: build IPT's pretrained prompt table for a backbone from the full
training sets, into the model cache where `ipt/strategy=pretrained` finds it (experiments/ipt_table.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.cli.common import add_data_argument
from openbook.models import DEFAULT_BACKBONE


def add_parser(commands: argparse._SubParsersAction) -> None:
    table = commands.add_parser(
        "ipt-table", help="build IPT's pretrained prompt table from the full training sets (model cache)"
    )
    add_data_argument(table, None, "the datasets directory holding full/ and k-shot/")
    table.add_argument("--method", default="ipt/strategy=pretrained", help="the spec the table is for")
    table.add_argument("--backbone", default=DEFAULT_BACKBONE)
    table.add_argument("--per-task", type=int, default=256, help="lines drawn from each task's train file")
    table.add_argument("--steps", type=int, default=120, help="optimiser steps, cycling through the tasks")
    table.add_argument("--batch-size", type=int, default=8)
    table.add_argument("--lr", type=float, default=1e-2)
    table.add_argument("--seed", type=int, default=0)
    table.add_argument("--device", default="cpu")


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from pathlib import Path

    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.methods import build_method
    from openbook.methods.ipt import IPTConfig, pretrain_prompt_table

    from research.experiments.ipt_table import FULL_TRAIN_FILES, kshot_texts, read_full_corpus

    config = build_method(args.method).config
    if not isinstance(config, IPTConfig):
        raise ValueError(f"{args.method} is not an ipt spec")
    tasks = config.corpus.split("+")
    unknown = sorted(set(tasks) - set(FULL_TRAIN_FILES))
    if unknown:
        raise ValueError(f"no full training set for {unknown}; known: {', '.join(FULL_TRAIN_FILES)}")
    backbone = load_backbone(BackboneConfig(name=args.backbone, max_length=128, device=args.device))
    datasets = Path(args.data)
    held_out = kshot_texts(datasets)
    corpora = [
        read_full_corpus(datasets, t, backbone, per_task=args.per_task, seed=args.seed, held_out=held_out)
        for t in tasks
    ]
    path = pretrain_prompt_table(
        backbone,
        corpora,
        config,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        progress=True,
    )
    print(path)
