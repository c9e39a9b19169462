"""`python -m research methods`: list the inference-time and the trainable methods."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_parser(commands: argparse._SubParsersAction) -> None:
    commands.add_parser("methods", help="list the inference and trainable methods")


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.methods import METHODS

    from research.experiments.evaluation import INFERENCE_METHODS

    for name, fn in INFERENCE_METHODS.items():
        print(f"{name:<14} (inference) {(fn.__doc__ or '').strip().splitlines()[0]}")
    for name, cls in METHODS.items():
        print(f"{name:<14} (trains)    {cls.summary}")
