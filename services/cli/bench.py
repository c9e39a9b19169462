"""`openbook bench api | job`: what the service costs, measured (nothing passes or fails).

`api`: the service's overheads against bare forwards of the backbone (bench_api.py, services/bench.py);
`job`: an automatic training job through the service end to end (bench_job.py). The lab's benches of the
library and its learning curve are `python -m research bench | learning-curve`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from services.cli import bench_api, bench_job

BENCHES = {"api": bench_api, "job": bench_job}


def add_parser(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="what the service costs: api (overheads), job (a training job)")
    benches = bench.add_subparsers(dest="bench", required=True)
    for module in BENCHES.values():
        module.add_parser(benches)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    return BENCHES[args.bench].run(args, argv)
