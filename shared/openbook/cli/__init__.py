"""The library's commands: `openbook classify`, `train`, `eval` and `prepare`.

One module per subcommand, each with `add_parser(commands)` and `run(args, argv)`; what they share is in
`common.py`. The `openbook` program (services/cli/) builds one parser from these and the service's
commands; `run_command` runs one as every command line does: a user's error in one line (exit 2), an
interruption in one line (exit 130).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from openbook.cli import classify, common, evaluate, prepare, train
from openbook.runtime import configure

COMMANDS = {
    "classify": classify,
    "train": train,
    "eval": evaluate,
    "prepare": prepare,
}


def run_command(
    prog: str,
    command: ModuleType,
    args: argparse.Namespace,
    argv: Sequence[str],
    *,
    resolve_data: bool = True,
) -> int:
    """`command.run(args, argv)` with torch's threads set (`openbook.runtime`) and `--data` resolved
    (`common.data_dir`, unless `resolve_data` is False); its exit status."""
    configure()
    try:
        if resolve_data and hasattr(args, "data_layout"):
            args.data = common.data_dir(args)
        command.run(args, argv)
    except common.USER_ERRORS as error:
        print(f"{prog} {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # what was recorded stays; the commands that record resume from it
        print(f"\n{prog} {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
