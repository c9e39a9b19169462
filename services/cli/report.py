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

TARGETS = (0.9, 0.95)  # the dev accuracies whose thresholds the summary names


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
    from openbook.quality import report_of

    manifest = verify_checkpoint(path)  # CheckpointError (a ValueError) unless whole and as written
    if manifest.get("dev_scores") is None:
        raise ValueError(f"{path} keeps no dev scores (saved without them, or with fewer than 2)")
    temperature = float(manifest["confidence_temperature"])
    report = report_of(scored_from_record(manifest["dev_scores"]), manifest["labels"], temperature)
    return {
        "checkpoint": str(path),
        "model_version": manifest.get("version", path.name),
        "scored_by": manifest.get("dev_scored_on", "dev"),
        **report,
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a person reads it: the headline, per label, confusion, calibration, thresholds."""
    from openbook.quality import CoveragePoint, threshold_for_accuracy

    labels = report["confusion"]["labels"]
    width = max(8, *(len(label) for label in labels))
    lines = [
        f"{report.get('task') or report.get('checkpoint')}: version {report['model_version']}, "
        f"{report['examples']} examples scored by {report['scored_by']}",
        f"accuracy {report['accuracy']:.3f}   macro-F1 {report['macro_f1']:.3f}   ECE {report['ece']:.3f}",
        "",
        f"{'label':<{width}}  precision  recall     f1  support",
    ]
    for label, scores in report["per_label"].items():
        lines.append(
            f"{label:<{width}}  {scores['precision']:9.3f}  {scores['recall']:6.3f}  {scores['f1']:5.3f}"
            f"  {scores['support']:7d}"
        )
    lines += [
        "",
        "confusion (rows: gold, columns: predicted)",
        " " * width + "".join(f"{x:>{width + 1}}" for x in labels),
    ]
    for label, row in zip(labels, report["confusion"]["matrix"], strict=True):
        lines.append(f"{label:<{width}}" + "".join(f"{count:>{width + 1}d}" for count in row))
    pairs = report.get("confused_pairs", [])
    lines += ["", f"most confused ({len(pairs)}): labelled -> predicted: examples"]
    lines += [f"  {pair['label']} -> {pair['predicted']}: {pair['count']}" for pair in pairs]
    calibration = report.get("calibration")
    if calibration:
        verdict = "adopted" if calibration["adopted"] else "not adopted"
        lines += [
            "",
            f"calibration: ECE {calibration['ece_before']:.3f} before, {calibration['ece_after']:.3f} after "
            f"temperature scaling ({calibration['folds']}-fold cross-validated; T = "
            f"{calibration['fitted_temperature']:.2f}, {verdict}; "
            f"served at T = {calibration['temperature']:.2f})",
        ]
    lines += ["", "threshold  coverage  accuracy"]
    for point in report["coverage"]:
        accuracy = "-" if point["accuracy"] is None else f"{point['accuracy']:.3f}"
        lines.append(f"{point['threshold']:9.2f}  {point['coverage']:8.3f}  {accuracy:>8}")
    coverage = [CoveragePoint(**point) for point in report["coverage"]]
    for target in TARGETS:
        reached = threshold_for_accuracy(coverage, target)
        lines.append(
            f"accuracy >= {target:.0%}: "
            + (
                "not reached at any threshold"
                if reached is None
                else f"min_confidence {reached.threshold:.2f} answers {reached.coverage:.0%} of them"
            )
        )
    suspects = report["suspect_examples"]
    lines += ["", f"suspect examples ({len(suspects)}): labelled, predicted, confidence"]
    for suspect in suspects[:20]:
        text = suspect.get("text")
        shown = "" if text is None else f"  {str(text)[:60]!r}"
        lines.append(
            f"  {suspect['id']:>8}  {suspect['label']} -> {suspect['predicted']}"
            f"  {suspect['confidence']:.3f}{shown}"
        )
    return "\n".join(lines)
