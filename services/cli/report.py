"""`openbook report`: how good a task is, printed.

    openbook report --task NAME [--version V] [--url URL] [--key KEY] [--json]
    openbook report --checkpoint DIR [--json]

With `--task`, the running service's report (GET /v1/tasks/{task}/report): the served version's, or a
recorded version's. With `--checkpoint`, a checkpoint's own dev scores (those `openbook train` and the
service's jobs keep), with no service running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report", help="how good a task (or a checkpoint) is", description=__doc__.splitlines()[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", help="a task of the running service")
    source.add_argument("--checkpoint", type=Path, help="a checkpoint directory, read without a service")
    parser.add_argument("--version", help="with --task: a recorded version (default: the one served)")
    parser.add_argument("--url", default=os.environ.get("OPENBOOK_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--key", default=os.environ.get("OPENBOOK_API_KEY"), help="the read or write key")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        report = _from_service(args) if args.task else _from_checkpoint(args.checkpoint)
    except (OSError, ValueError, KeyError, LookupError) as error:
        print(f"openbook report: error: {error}", file=sys.stderr)
        return 2
    from openbook.cli.report_text import format_report

    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _from_service(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from services.client import OpenBookClient, OpenBookError

    headers = {"X-API-Key": args.key} if args.key else {}
    try:
        with OpenBookClient(http=httpx.Client(base_url=args.url, headers=headers, timeout=600)) as client:
            return client.report(args.task, args.version).model_dump()
    except OpenBookError as error:
        raise LookupError(f"{args.url} answered {error.status}: {error.detail}") from None
    except httpx.HTTPError as error:
        raise OSError(f"cannot reach the service at {args.url}: {error}") from None


def _from_checkpoint(path: Path) -> dict[str, Any]:
    from openbook.artifacts import verify_checkpoint
    from openbook.fitting import scored_from_record
    from openbook.quality import readers_on_dev, report_of

    manifest = verify_checkpoint(path)  # CheckpointError (a ValueError) unless whole and as written
    if manifest.get("dev_scores") is None:
        raise ValueError(f"{path} keeps no dev scores (saved without them, or with fewer than 2)")
    temperature = float(manifest["confidence_temperature"])
    scored = scored_from_record(manifest["dev_scores"])
    report = report_of(scored, manifest["labels"], temperature, readers_on_dev(manifest))
    return {
        "checkpoint": str(path),
        "model_version": manifest.get("version", path.name),
        "scored_by": manifest.get("dev_scored_on", "dev"),
        **report,
    }
