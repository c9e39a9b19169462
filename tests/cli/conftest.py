"""What the command-line tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def training_flags() -> list[str]:
    """A few tiny training steps, for `openbook train` and for trainable methods in `openbook eval`."""
    return [
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--train-batch-size",
        "4",
        "--lr",
        "1e-3",
        "--max-length",
        "48",
    ]
