"""`python -m research profile-report`: where the served path's time goes, from a py-spy profile of the
api (research/profile_report.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "profile-report", help="a py-spy profile of the api, its served path's samples summed by stage"
    )
    report.add_argument("profile", type=Path, help="py-spy record --format raw output")
    report.add_argument("--top", type=int, default=16, help="stages to show")


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from research.profile_report import report

    print(report(args.profile, args.top))
