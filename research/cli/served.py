"""`python -m research served`: what a task serves after one service job, read on test.

Each seed's k-shot training split is fitted as the service's job fits posted examples (dev held out of
them by the ids' hash, the served reader tuned again on every example: `research.experiments.served`),
and the version read on the task's test split and out-of-scope queries. Records go to OUT/served.json,
one per (task, seed) as it lands, so a run stopped anywhere resumes."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from openbook.cli.common import (
    add_data_argument,
    add_label_scoring_argument,
    add_prompt_arguments,
    add_training_arguments,
)

from research import PROG

RECORDS = "served.json"


def add_parser(commands: argparse._SubParsersAction) -> None:
    from openbook.encoders import default_reader
    from openbook.methods import DEFAULT_METHOD

    served = commands.add_parser(
        "served",
        help="a task's version after one service job (dev held out by hash, the reader tuned again), on test",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    add_data_argument(served, "k-shot", "directory in the k-shot layout")
    served.add_argument("--task", default="clinc150", help="tasks, separated by commas")
    served.add_argument("--seeds", default="13")
    served.add_argument("--shots", type=int, default=10, help="examples per class of each seed's split")
    served.add_argument("--method", default=DEFAULT_METHOD, help="the task's method (default: %(default)s)")
    served.add_argument(
        "--reader",
        default=default_reader(),
        help="the task's sentence reader (default: %(default)s; none: none)",
    )
    add_prompt_arguments(served)
    add_label_scoring_argument(served)
    add_training_arguments(served)
    served.add_argument(
        "--at-lam",
        default="",
        help="comma-separated λs at which to read test again, in place of the one the job chose (one fit)",
    )
    served.add_argument("--out", required=True, help=f"directory of {RECORDS}")


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.atomic import add_json_record
    from openbook.cli.common import classifier_from_args, train_config
    from openbook.data import load_kshot
    from openbook.encoders import chosen_reader

    from research.experiments.served import served_run
    from research.learning_curve.run import hardware, source

    out = Path(args.out)
    target = out / RECORDS
    done = {(r["task"], r["seed"]) for r in (json.loads(target.read_text()) if target.is_file() else [])}
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    for task in tasks:
        for seed in seeds:
            if (task, seed) in done:
                continue
            splits = load_kshot(args.data, task, seed, args.shots)
            classifier = classifier_from_args(args, task, reader=chosen_reader(args.reader))
            record = {"task": task, "seed": seed, "shots": args.shots}
            at_lams = [float(lam) for lam in args.at_lam.split(",") if lam.strip()]
            record |= served_run(classifier, args.method, splits, train_config(args, seed), at_lams=at_lams)
            record |= {
                "command": f"{PROG} {shlex.join(argv)}",
                "backbone": args.backbone,
                "method": args.method,
                "reader": args.reader,
                "label_scoring": args.label_scoring,
                "hardware": hardware(),
                "source": source(out),
            }
            out.mkdir(parents=True, exist_ok=True)
            add_json_record(target, record)
            print(json.dumps({k: v for k, v in record.items() if k not in ("hardware", "source")}))
