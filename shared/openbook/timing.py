"""What the benchmarks time with (`openbook bench api`, the lab's library benches): a median wall time
that waits for a GPU's queued kernels, and synthetic sentences to time on."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

_WORDS = (
    "the a film movie story plot cast acting was is it this that great terrible good bad dull funny "
    "moving slow quick long short and but not very quite rather with without its one of an best worst"
).split()


def synthetic_sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(12, 28)))) for _ in range(count)]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the kernels queued on a CUDA `device` (None: the current one, if CUDA is in use).

    CUDA calls return once their kernels are queued: a timer stopped without this measures the queueing.
    """
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], repeats: int, warmup: int = 1, device: torch.device | str | None = None
) -> float:
    """Median wall time of `fn`; on a GPU each call is timed to the end of its queued kernels."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)
