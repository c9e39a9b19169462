"""Micro-batching: concurrent classify requests for a task share one backbone forward.

A request's texts join a queue; one consumer per task takes the first waiting
request and every request already queued behind it. If the previous forward
was shared by several requests (the service is under concurrent load), it
then waits for more, for at most `max_delay` seconds after the first and up
to `max_batch` texts: until as many requests as the previous forward served
have come, and after that while they keep arriving less than `max_wait`
seconds apart. It runs a single `predict` in a worker thread and hands each
request its slice. The event loop never waits on the model.

Why wait like this: under load, the clients of one forward send their next
requests as soon as their answers arrive, so the wave comes back spread over
the time the server and the clients take to answer, parse and resend. A fixed
2 ms window cut that wave into a tiny batch and a big one, and so did a rule
that stopped at the first gap over `max_wait` when the clients were 32
threads of one Python process (their answers queue for the GIL, and the wave
spread over about 100 ms). The previous forward's size says how big the wave
is, whatever spreads it. A lone
client, whose forwards are never shared, pays no wait at all: its request
goes straight to the backbone, and requests that arrive during that forward
form the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openbook.classifier import Prediction
from openbook.prompting import TextInput

from services.api.tasks import TaskRuntime

Result = tuple[list[Prediction], str, str]  # predictions, model version, store version
Offload = Callable[..., Awaitable[Any]]  # runs a blocking call in a worker thread: offload(fn, *args)


@dataclass
class _Request:
    texts: Sequence[TextInput]
    future: asyncio.Future[Result]


class MicroBatcher:
    def __init__(
        self,
        runtime: TaskRuntime,
        *,
        max_batch: int,
        max_wait: float,  # the longest gap between two arrivals that still joins them in one forward
        max_delay: float,  # the longest a request waits for others
        on_forward: Callable[[int], None] | None = None,  # texts per forward, for the metrics
        offload: Offload = asyncio.to_thread,
    ) -> None:
        self.runtime = runtime
        self.offload = offload
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_delay = max(max_delay, max_wait)
        self.on_forward = on_forward
        self.queue: asyncio.Queue[_Request | None] = asyncio.Queue()  # None: retire after what is queued
        self.last_requests = 0  # requests the previous forward served
        self.consumer = asyncio.create_task(self._consume())

    async def predict(self, texts: Sequence[TextInput]) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Request(texts, future))
        return await future

    def retire(self) -> None:
        """Answer the requests already queued, then stop: another batcher has taken over the task."""
        self.queue.put_nowait(None)

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        retiring = False
        while not retiring:
            first = await self.queue.get()
            if first is None:
                return
            batch, size = [first], len(first.texts)
            while size < self.max_batch and not self.queue.empty() and not retiring:
                request = self.queue.get_nowait()
                if request is None:
                    retiring = True
                else:
                    batch.append(request)
                    size += len(request.texts)
            deadline = loop.time() + self.max_delay
            under_load = self.last_requests > 1 or len(batch) > 1
            while (
                under_load
                and not retiring
                and size < self.max_batch
                and (remaining := deadline - loop.time()) > 0
            ):
                # Until as many requests as last time have come, wait up to max_delay for the next one;
                # after that, only while they keep arriving less than max_wait apart.
                patience = remaining if len(batch) < self.last_requests else min(self.max_wait, remaining)
                try:
                    request = await asyncio.wait_for(self.queue.get(), patience)
                except TimeoutError:
                    break
                if request is None:
                    retiring = True
                else:
                    batch.append(request)
                    size += len(request.texts)
            self.last_requests = len(batch)
            texts = [text for request in batch for text in request.texts]
            if self.on_forward is not None:
                self.on_forward(len(texts))
            try:
                predictions, model_version, store_version = await self.offload(self.runtime.predict, texts)
            except Exception as error:  # every waiting request gets the error, the consumer lives on
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            start = 0
            for request in batch:
                end = start + len(request.texts)
                if not request.future.done():
                    request.future.set_result((predictions[start:end], model_version, store_version))
                start = end

    async def close(self) -> None:
        self.consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.consumer


class Batchers:
    """One MicroBatcher per task, replaced when the task's runtime is (a task deleted and re-created)."""

    def __init__(self, **options: Any) -> None:
        self.options = options  # MicroBatcher's keyword arguments
        self.batchers: dict[str, MicroBatcher] = {}
        self.retiring: set[asyncio.Task] = set()  # asyncio keeps only weak references to tasks

    def batcher_for(self, runtime: TaskRuntime) -> MicroBatcher:
        batcher = self.batchers.get(runtime.task.name)
        if batcher is None or batcher.runtime is not runtime:
            if batcher is not None:  # the old one answers what it holds, then stops
                batcher.retire()
                self.retiring.add(batcher.consumer)
                batcher.consumer.add_done_callback(self.retiring.discard)
            batcher = MicroBatcher(runtime, **self.options)
            self.batchers[runtime.task.name] = batcher
        return batcher

    async def close(self) -> None:
        for batcher in self.batchers.values():
            await batcher.close()
