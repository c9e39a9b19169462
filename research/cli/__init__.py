"""`python -m research <command>`: the laboratory's command line.

eval (the resumable grid of methods x seeds), methods, relabel, splits, held-out-intents, continual,
knn-selection, first-use, bench (the library's benches), learning-curve (through the service), ipt-table,
profile-report, two-readers and served. One module per command, each with `add_parser(commands)` and
`run(args, argv)`, as the product's commands (`openbook.cli`) are; their common arguments are the library's
(`openbook/cli/common.py`), what a results directory records is `settings.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from openbook.cli import run_command

from research import PROG
from research.cli import (
    bench,
    continual,
    evaluate,
    first_use,
    held_out_intents,
    ipt_table,
    knn_selection,
    learning_curve,
    methods,
    profile_report,
    relabel,
    served,
    splits,
    two_readers,
)

COMMANDS = {
    "eval": evaluate,
    "methods": methods,
    "relabel": relabel,
    "splits": splits,
    "held-out-intents": held_out_intents,
    "continual": continual,
    "knn-selection": knn_selection,
    "first-use": first_use,
    "bench": bench,
    "learning-curve": learning_curve,
    "ipt-table": ipt_table,
    "profile-report": profile_report,
    "two-readers": two_readers,
    "served": served,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("\n", " "))
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # first-use --probes reads no data, so it needs no --data
    resolve_data = not getattr(args, "probes", False)
    return run_command(PROG, COMMANDS[args.command], args, argv, resolve_data=resolve_data)
