"""Worker threads for blocking calls, in two sets sized apart: one for writes, one for reads.

Everything blocking (Redis, the model, the store) runs off the event loop in a worker thread. A write
can wait long: for Redis to fsync, or for the task's store while a restarted replica replays its log.
With one shared set, enough waiting writes take every thread and the reads queue behind them; with
two, writes wait for write threads only, and reads always have threads of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.to_thread

T = TypeVar("T")
Args = TypeVarTuple("Args")


class ReadWriteThreads:
    def __init__(self, *, reads: int, writes: int) -> None:
        self._reads = anyio.CapacityLimiter(reads)
        self._writes = anyio.CapacityLimiter(writes)

    async def read(self, function: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        return await anyio.to_thread.run_sync(function, *args, limiter=self._reads)

    async def write(self, function: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        return await anyio.to_thread.run_sync(function, *args, limiter=self._writes)
