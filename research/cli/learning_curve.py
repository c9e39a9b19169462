"""`python -m research learning-curve`: accuracy against labelled examples through the service
(research/learning_curve/)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import get_args

from research import PROG


def _list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        return [kind(item) for item in text.split(",") if item]

    return parse


def _size(text: str) -> int | None:
    return None if text == "all" else int(text)


def add_parser(commands: argparse._SubParsersAction) -> None:
    from openbook.backbone import BackboneConfig
    from openbook.cli.common import add_device_argument
    from openbook.config_fields import add_field_arguments
    from openbook.methods import DEFAULT_METHOD
    from openbook.models import DEFAULT_BACKBONE
    from openbook.train_config import Keep, TrainConfig

    from research.learning_curve.schedule import ORDERS, ROUNDS

    parser = commands.add_parser(
        "learning-curve",
        help="accuracy against labelled examples per class, through the service (a simulated labeller)",
        description="accuracy against labelled examples per class: the service with automatic training, "
        "driven over HTTP by a simulated labeller, against baselines on the same examples",
    )
    parser.add_argument("--task", type=_list(str), help="comma-separated, e.g. SST-2,trec")
    parser.add_argument("--seeds", type=_list(int), default=[13, 21])
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE)
    parser.add_argument("--data", help="the full/ directory (default: $OPENBOOK_DATA/full)")
    parser.add_argument("--out", type=Path, default=Path("docs/learning-curve"))
    parser.add_argument(
        "--rounds", type=_list(int), default=list(ROUNDS), help="cumulative examples per class"
    )
    parser.add_argument("--orders", type=_list(str), default=list(ORDERS))
    parser.add_argument(
        "--baselines",
        type=_list(str),
        help="knn-interp, prompt-ft, setfit (all-mpnet-base-v2), setfit with options: setfit/encoder=minilm "
        "(default: knn-interp,prompt-ft,setfit)",
    )
    parser.add_argument("--method", default=DEFAULT_METHOD, help="the service task's method")
    parser.add_argument("--reader", help="the service task's sentence reader (e.g. mpnet; default: none)")
    parser.add_argument(
        "--test-size", type=_size, default=500, help="test examples scored ('all': every one)"
    )
    parser.add_argument("--pool-size", type=_size, default=500, help="the uncertainty order's pool ('all')")
    parser.add_argument(
        "--judge",
        type=int,
        help="score on this many training examples held out of the labelling instead of test (a curve to "
        "choose on; --test-size is then unused)",
    )
    parser.add_argument(
        "--baselines-only",
        action="store_true",
        help="run the fixed order's baselines alone, without the service, into --out beside the rounds "
        "recorded there (a baseline added to a curve); --orders fixed",
    )
    parser.add_argument(
        "--untrained-gate",
        action="store_true",
        help="the service's first gate against the untrained task (OPENBOOK_UNTRAINED_GATE)",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, help="the jobs' budget in steps (default: the default budget)")
    budget.add_argument("--epochs", type=float, help="the jobs' budget in epochs instead")
    parser.add_argument("--max-steps", type=int, help="the budget's cap")
    parser.add_argument("--min-steps", type=int, help="with --epochs: the budget's floor")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--eval-every", type=int, help="steps between dev checks")
    parser.add_argument("--patience", type=int, default=TrainConfig.patience)
    parser.add_argument(
        "--keep",
        choices=get_args(Keep),
        default=TrainConfig.keep,
        help="the jobs' kept weights: the last (default), or the dev checks' best",
    )
    add_field_arguments(parser, BackboneConfig, ("max_length",))
    add_device_argument(parser)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a round's jobs may take")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="run the (task, seed, order) units as this many processes at once (each with cores / N "
        "threads, or sharing one GPU), each merged into --out as it ends",
    )
    parser.add_argument(
        "--merge",
        type=_list(Path),
        metavar="DIRS",
        help="run nothing: gather the results in these comma-separated output directories (units run as "
        "separate processes) into --out, refusing different setups and duplicate records",
    )
    parser.add_argument(
        "--baselines-from",
        type=Path,
        metavar="DIR",
        help="run nothing: copy into --out the --baselines that curve DIR recorded for --out's tasks, seeds"
        " and rounds (baselines that do not depend on what differs: prompt-ft, SetFit), checked to have"
        " run with the same settings",
    )
    parser.add_argument(
        "--relabel",
        action="store_true",
        help="run nothing: name the SetFit baselines in --out by the options they ran with (a MiniLM "
        "baseline recorded as setfit becomes setfit/encoder=minilm/max-steps=0)",
    )


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.data import data_root
    from openbook.train_config import TrainConfig

    from research.learning_curve.baselines import BASELINES, canonical_baseline
    from research.learning_curve.run import run_in_processes, run_learning_curve
    from research.learning_curve.service import Waiting
    from research.learning_curve.settings import CurveSettings

    if args.relabel:
        from research.learning_curve.setup import relabel_curve

        renames = relabel_curve(args.out)
        for old, new in renames.items():
            print(f"{args.out}: {old} -> {new}")
        if not renames:
            print(f"{args.out}: every baseline already named by what it ran")
        return
    if args.merge:
        from research.learning_curve.setup import merge_results

        merge_results(args.out, args.merge)
        print(f"merged {len(args.merge)} result directories into {args.out}")
        return
    if args.baselines_from:
        from research.learning_curve.setup import copy_baselines

        if not args.baselines:
            raise ValueError("--baselines-from copies the --baselines named; name them")
        copied = copy_baselines(
            args.out, args.baselines_from, [canonical_baseline(b) for b in args.baselines]
        )
        print(f"copied {len(copied)} baseline records from {args.baselines_from} into {args.out}")
        return
    if not args.task:
        raise ValueError("--task is required (unless --merge, --baselines-from or --relabel)")
    if args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    settings = CurveSettings(
        data=Path(args.data) if args.data else data_root() / "full",
        out=args.out,
        tasks=args.task,
        seeds=args.seeds,
        backbone=args.backbone,
        rounds=args.rounds,
        orders=args.orders,
        baselines=[canonical_baseline(name) for name in args.baselines or BASELINES],
        method=args.method,
        reader=args.reader,
        test_size=args.test_size,
        pool_size=args.pool_size,
        training={
            "batch_size": args.batch_size,
            "lr": args.lr,
            "patience": args.patience,
            "keep": args.keep,
            **TrainConfig(
                steps=args.steps,
                epochs=args.epochs,
                max_steps=args.max_steps,
                min_steps=args.min_steps,
                eval_every=args.eval_every,
            ).budget(),
        },
        max_length=args.max_length,
        device=args.device,
        untrained_gate=args.untrained_gate,
        judge=args.judge,
        baselines_only=args.baselines_only,
        waiting=Waiting(timeout=args.timeout),
        command=f"{PROG} {shlex.join(argv)}",
    )
    if args.parallel > 1:
        run_in_processes(settings, argv, args.parallel)
    else:
        run_learning_curve(settings)
