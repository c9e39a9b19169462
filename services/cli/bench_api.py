"""`openbook bench api`: the service's overheads, measured in-process (services/bench.py)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _counts(text: str) -> list[int]:
    return [int(count) for count in text.split(",")]


def add_parser(benches: argparse._SubParsersAction) -> None:
    from openbook.backbone import BackboneConfig
    from openbook.config_fields import add_field_arguments
    from openbook.models import DEFAULT_BACKBONE

    parser = benches.add_parser(
        "api", help="the service's overheads, as ratios", description="service overheads as ratios"
    )
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE)
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="serve a random-weight model with the backbone's tokenizer and layer types but 2 layers of "
        "width 64: its forward costs milliseconds, as a GPU's does, so the service's own costs show",
    )
    add_field_arguments(parser, BackboneConfig, ("max_length",))
    parser.add_argument("--requests", type=int, default=20, help="timed single requests (median reported)")
    parser.add_argument(
        "--clients",
        type=_counts,
        default=[32],
        help="concurrent clients, comma-separated: one throughput line each, e.g. 32,256",
    )
    parser.add_argument(
        "--workers",
        type=_counts,
        default=[1],
        help="api processes behind the port, comma-separated: latency, throughput and freshness once per"
        " count, e.g. 1,2,4 (1: in the bench's process; N > 1: `openbook serve` with OPENBOOK_API_WORKERS=N)",
    )
    parser.add_argument(
        "--reader",
        help="also measure a task keyed by this sentence encoder (e.g. mpnet) against the same task without",
    )
    parser.add_argument(
        "--fronts",
        type=_counts,
        default=[0],
        help="front processes before the api workers, comma-separated, e.g. 0,2: each count > 0 measures "
        "latency, throughput and freshness again through `openbook serve` with OPENBOOK_FRONT_WORKERS set",
    )
    parser.add_argument(
        "--no-hot-swap",
        dest="hot_swap",
        action="store_false",
        help="leave out the hot swap under load and the two replicas' comparison (run with 1 worker)",
    )


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from services.bench import run_api_bench

    run_api_bench(
        args.backbone,
        max_length=args.max_length,
        requests=args.requests,
        clients=args.clients,
        stand_in=args.stand_in,
        workers=args.workers,
        fronts=args.fronts,
        reader=args.reader,
        hot_swap=args.hot_swap,
    )
    return 0
