"""`openbook`: the product's command line, one parser.

The library's commands (`openbook.cli`): classify, train, eval (a user's own labelled data) and prepare.
The service's, one module each here: up (the whole stack, supervised), serve (the api), worker
(the trainer), report (a task's quality) and bench api | job (what the service costs). Each subcommand
module imports what it needs only when it runs, so `openbook --help` stays quick. The laboratory's
commands (the evaluation grids, learning curves, judge splits) are apart, in a checkout:
`python -m research --help`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from openbook.cli import COMMANDS as LIBRARY_COMMANDS
from openbook.cli import run_command

from services.cli import bench, report

SERVICE_COMMANDS = ("up", "serve", "worker")  # run by `importlib` (services.cli.<command>.run(args))
TOOLS = {"report": report, "bench": bench}  # each says its own errors and returns its exit status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openbook",
        description="A few-shot text classifier that gets better as people teach it.",
        epilog="The laboratory's commands (grids, learning curves) run from a checkout: python -m research "
        "--help.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in LIBRARY_COMMANDS.values():
        command.add_parser(commands)
    report.add_parser(commands)
    _add_service_parsers(commands)
    bench.add_parser(commands)
    return parser


def _add_service_parsers(commands: argparse._SubParsersAction) -> None:
    up = commands.add_parser("up", help="the whole stack, supervised: Redis (embedded), the api, the trainer")
    up.add_argument("--demo", action="store_true", help="create a demo task seeded with examples")
    serve = commands.add_parser("serve", help="the api (FastAPI), configured from OPENBOOK_*")
    for parser in (up, serve):
        parser.add_argument(
            "--api-workers",
            type=int,
            metavar="N",
            help="N api processes behind the port (sets OPENBOOK_API_WORKERS for the api)",
        )
        parser.add_argument(
            "--front-workers",
            type=int,
            metavar="F",
            help="F front processes on the port that gather single-text classify requests for the api "
            "behind them (sets OPENBOOK_FRONT_WORKERS)",
        )
    commands.add_parser("worker", help="the trainer: takes jobs off the bus until SIGINT or SIGTERM")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command in LIBRARY_COMMANDS:
        return run_command("openbook", LIBRARY_COMMANDS[args.command], args, argv)
    if args.command in TOOLS:
        return TOOLS[args.command].run(args, argv)
    # read where the api builds its settings
    for flag, variable in (
        (getattr(args, "api_workers", None), "OPENBOOK_API_WORKERS"),
        (getattr(args, "front_workers", None), "OPENBOOK_FRONT_WORKERS"),
    ):
        if flag is not None:
            os.environ[variable] = str(flag)
    problem = settings_problem()
    if problem:
        print(f"openbook {args.command}: error: {problem}", file=sys.stderr)
        return 2
    return importlib.import_module(f"services.cli.{args.command}").run(args)


def settings_problem() -> str | None:
    """What is wrong with the `OPENBOOK_*` settings the service reads, one clause per setting, before
    anything starts; None when nothing is. A device torch cannot reach here counts."""
    from openbook.devices import require_device, resolve_device
    from pydantic import ValidationError

    from services.api.settings import Settings

    try:
        device = Settings().device
    except ValidationError as error:
        return "; ".join(
            (f"OPENBOOK_{str(e['loc'][-1]).upper()}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in error.errors()
        )
    try:
        require_device(resolve_device(device))
    except ValueError as error:
        return f"OPENBOOK_DEVICE: {error}"
    return None


def fit_threads(threads: int | None) -> None:
    """torch and FAISS each use one thread per core (or `OPENBOOK_THREADS`), not more (`openbook.runtime`)."""
    from openbook.runtime import configure

    configure(threads or os.cpu_count() or 1)
