"""`python -m research relabel`: name an evaluation's recorded runs by what they ran, after a default
changed."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_parser(commands: argparse._SubParsersAction) -> None:
    relabel = commands.add_parser(
        "relabel",
        help="name the runs of `python -m research eval` directories by their recorded options, today's"
        " defaults",
    )
    relabel.add_argument(
        "dirs", nargs="+", metavar="DIR", help="a directory `python -m research eval --out` wrote"
    )


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from research.experiments.reports import relabel

    for out in args.dirs:
        renames = relabel(out)
        for old, new in renames.items():
            print(f"{out}: {old} -> {new}")
        if not renames:
            print(f"{out}: every run already named by what it ran")
