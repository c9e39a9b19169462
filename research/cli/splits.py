"""`python -m research splits`: fresh 16-shot train and dev splits drawn from the full training sets
(`research/splits.py`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.cli.common import add_data_argument


def add_parser(commands: argparse._SubParsersAction) -> None:
    splits = commands.add_parser(
        "splits",
        help="fresh few-shot train/dev splits from the full training sets, none of them a text the standard "
        "k-shot splits score (their dev and test)",
    )
    add_data_argument(splits, None, "the evaluation data: its full/ and k-shot/ directories")
    splits.add_argument("--task", default="SST-2,trec,mpqa,sst-5", help="comma-separated")
    splits.add_argument("--seeds", required=True, help="comma-separated; none of the standard ones")
    splits.add_argument("--shots", type=int, default=16, help="examples per label, in train and in dev")
    splits.add_argument("--out", required=True, help="a directory in the k-shot layout, for eval --data")
    splits.add_argument(
        "--judge",
        type=int,
        default=0,
        help="examples set apart from every seed's train and dev, written as the task's test.csv: "
        "`python -m research eval --data OUT` scores runs on them, never on the real test set",
    )


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from pathlib import Path

    from research.splits import fresh_pool, set_apart, short_labels, write_fresh_splits

    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    if args.shots < 1 or not seeds:
        raise ValueError("--shots must be at least 1, and --seeds must name at least one seed")
    for task in [task for task in args.task.split(",") if task]:
        full, kshot = Path(args.data) / "full", Path(args.data) / "k-shot"
        written = write_fresh_splits(full, kshot, args.out, task, seeds, args.shots, args.judge)
        print(f"{task}: {len(written)} of {len(seeds)} seeds written under {Path(args.out) / task}")
        pool = fresh_pool(full, kshot, task)
        if args.judge:
            print(f"  judge: {args.judge} examples in {Path(args.out) / task / 'test.csv'}")
            pool = set_apart(pool, args.judge)[1]
        for label, n in short_labels(pool, args.shots).items():
            print(f"  label {label!r}: {n} examples left, so {n // 2} in train and {n // 2} in dev")
