"""`openbook bench store | train`: the library's performance benchmarks, printed as measured ratios."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.cli.common import add_prompt_arguments


def add_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="performance benchmarks (ratios, not pass/fail)")
    bench.add_argument("what", choices=["store", "train"])
    bench.add_argument("--sizes", default="10000,100000", help="store sizes (bench store)")
    bench.add_argument(
        "--train-batch-size", type=int, default=8, help="batch of a training step (bench train)"
    )
    bench.add_argument("--repeats", type=int, default=5, help="timed repeats, median reported (bench train)")
    add_prompt_arguments(bench)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.experiments.bench import run_store_bench, run_train_bench

    (run_store_bench if args.what == "store" else run_train_bench)(args)
