"""The `openbook` command: eval, train, methods, classify, bench, continual, knn-selection, first-use,
prepare, splits, relabel.

One module per subcommand, each with `add_parser(commands)` and `run(args, argv)`;
what they share is in `common.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from openbook.cli import (
    bench,
    classify,
    common,
    continual,
    evaluate,
    first_use,
    knn_selection,
    methods,
    prepare,
    relabel,
    splits,
    train,
)
from openbook.runtime import configure

COMMANDS = {
    "eval": evaluate,
    "train": train,
    "methods": methods,
    "classify": classify,
    "bench": bench,
    "continual": continual,
    "knn-selection": knn_selection,
    "first-use": first_use,
    "prepare": prepare,
    "splits": splits,
    "relabel": relabel,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openbook", description=__doc__.split("\n\n")[0].replace("\n", " "))
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    configure()
    try:
        if hasattr(args, "data_layout") and not getattr(
            args, "probes", False
        ):  # first-use --probes reads none
            args.data = common.data_dir(args)
        COMMANDS[args.command].run(args, argv)
    except common.USER_ERRORS as error:
        print(f"openbook {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # what was recorded stays; eval and the grids resume from it
        print(f"\nopenbook {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
