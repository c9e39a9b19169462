"""`python -m research held-out-intents`: a judge of out-of-scope refusal from clinc150's own intents, some
held out as out of scope (`research/held_out_intents.py`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.cli.common import add_data_argument


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "held-out-intents",
        help="new train/dev splits of a many-label task with some labels held out as its out-of-scope "
        "queries, and a judge of the rest: refusal judged without the real out-of-scope test queries",
    )
    add_data_argument(parser, None, "the evaluation data: its k-shot/ directory")
    parser.add_argument("--task", default="clinc150")
    parser.add_argument("--seeds", required=True, help="comma-separated; none of the standard ones")
    parser.add_argument("--shots", type=int, default=10, help="examples per kept label, in train and in dev")
    parser.add_argument(
        "--hold-out", type=int, default=30, help="labels that leave the task, drawn with seed 0"
    )
    parser.add_argument(
        "--judge", type=int, default=20, help="examples of each kept label in the judge (test.csv)"
    )
    parser.add_argument("--out", required=True, help="a directory in the k-shot layout, for eval --data")


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from pathlib import Path

    from research.held_out_intents import write_held_out_intents

    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    if args.shots < 1 or not seeds:
        raise ValueError("--shots must be at least 1, and --seeds must name at least one seed")
    kshot = Path(args.data) / "k-shot"
    written = write_held_out_intents(
        kshot, args.out, args.task, seeds, shots=args.shots, count=args.hold_out, judge=args.judge
    )
    task_dir = Path(args.out) / args.task
    kept = len((task_dir / "labels.txt").read_text().splitlines())
    print(f"{args.task}: {len(written)} of {len(seeds)} seeds written under {task_dir}; {kept} labels kept")
