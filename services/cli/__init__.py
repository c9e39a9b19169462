"""`openbook up | serve | worker | report | bench api | bench job`, the service
commands; every other command is the library's.

One module per command: `up` (the whole stack, supervised), `serve` (the
api), `worker` (the trainer), `report` (a task's quality), `bench_api`,
and `bench_job`. Each imports what it needs only when it runs, so
`openbook --help` stays quick.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

SERVICE_COMMANDS = ("up", "serve", "worker")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "api"]:
        from services.cli.bench_api import run_bench_api

        return run_bench_api(argv[2:])
    if argv[:1] == ["report"]:
        from services.cli.report import run_report

        return run_report(argv[1:])
    if argv[:2] == ["bench", "job"]:
        from services.cli.bench_job import run_bench_job

        return run_bench_job(argv[2:])
    if not argv or argv[0] not in SERVICE_COMMANDS:
        from openbook.cli import main as library_main

        if argv and argv[0] in ("-h", "--help"):
            print(
                "service commands: openbook up [--demo] [--api-workers N] [--front-workers F] | serve"
                " [--api-workers N] [--front-workers F] | worker | report | bench api | bench job"
                "\n"
            )
        return library_main(argv)
    parser = argparse.ArgumentParser(prog=f"openbook {argv[0]}")
    parser.add_argument("--demo", action="store_true", help="up: create a demo task seeded with examples")
    parser.add_argument(
        "--api-workers",
        type=int,
        metavar="N",
        help="up, serve: N api processes behind the port (sets OPENBOOK_API_WORKERS for the api)",
    )
    parser.add_argument(
        "--front-workers",
        type=int,
        metavar="F",
        help="up, serve: F front processes on the port that gather single-text classify requests for the"
        " api behind them (sets OPENBOOK_FRONT_WORKERS)",
    )
    args = parser.parse_args(argv[1:])
    # read where the api builds its settings
    for flag, variable in (
        (args.api_workers, "OPENBOOK_API_WORKERS"),
        (args.front_workers, "OPENBOOK_FRONT_WORKERS"),
    ):
        if flag is not None:
            os.environ[variable] = str(flag)
    problem = settings_problem()
    if problem:
        print(f"openbook {argv[0]}: error: {problem}", file=sys.stderr)
        return 2
    return importlib.import_module(f"services.cli.{argv[0]}").run(args)


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
