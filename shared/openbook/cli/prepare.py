"""`openbook prepare`: convert a packaged backbone into the model cache once, offline."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from openbook.models import DEFAULT_BACKBONE


def add_parser(commands: argparse._SubParsersAction) -> None:
    prepare = commands.add_parser("prepare", help="convert and cache a packaged backbone (offline)")
    prepare.add_argument("--backbone", default=DEFAULT_BACKBONE)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.models import resolve_backbone

    print(resolve_backbone(args.backbone))
