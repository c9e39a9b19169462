"""`python -m research bench store | train | tasks | mixed | labels | compile`: the library's performance
benchmarks, as ratios."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.cli.common import add_label_scoring_argument, add_prompt_arguments


def add_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="performance benchmarks (ratios, not pass/fail)")
    bench.add_argument("what", choices=["store", "train", "tasks", "mixed", "labels", "compile"])
    bench.add_argument("--sizes", default="10000,100000", help="store sizes (bench store)")
    bench.add_argument(
        "--train-batch-size", type=int, default=8, help="batch of a training step (bench train)"
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed repeats, median reported (bench train, mixed, labels, compile)",
    )
    bench.add_argument(
        "--tasks", default="1,10,100", help="task counts on one shared backbone (bench tasks, mixed)"
    )
    bench.add_argument(
        "--method", default="lora", help="a method that keeps the backbone frozen (bench tasks, mixed)"
    )
    bench.add_argument(
        "--steps", type=int, default=2, help="training steps of the task's method (bench tasks)"
    )
    bench.add_argument("--texts", type=int, default=32, help="texts classified (bench labels)")
    bench.add_argument("--examples", type=int, default=64, help="examples added to the store (bench labels)")
    bench.add_argument(
        "--rows", default="1,16,256,1024", help="prompts per forward, eager then compiled (bench compile)"
    )
    bench.add_argument(
        "--max-rows", type=int, default=1024, help="the largest bucket compiled (bench compile)"
    )
    bench.add_argument(
        "--data", help="the folder that holds k-shot/clinc150 (bench labels; default: $OPENBOOK_DATA)"
    )
    add_prompt_arguments(bench)
    add_label_scoring_argument(bench)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from research.experiments.bench import run_store_bench, run_train_bench
    from research.experiments.bench_compile import run_compile_bench
    from research.experiments.bench_labels import run_labels_bench
    from research.experiments.bench_mixed import run_mixed_bench
    from research.experiments.bench_tasks import run_tasks_bench

    benches = {
        "store": run_store_bench,
        "train": run_train_bench,
        "tasks": run_tasks_bench,
        "mixed": run_mixed_bench,
        "labels": run_labels_bench,
        "compile": run_compile_bench,
    }
    benches[args.what](args)
