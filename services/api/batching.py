"""Micro-batching: concurrent classify requests for a task share one backbone forward.

A request's texts join a queue; one consumer per task takes the first waiting
request and every request already queued behind it. If the previous forward
was shared by several requests (the service is under concurrent load), it
keeps taking requests while they arrive less than `max_wait` seconds apart,
until `max_batch` texts or `max_delay` seconds after the first. It runs a
single `predict` in a worker thread and hands each request its slice. The
event loop never waits on the model.

Waiting on the gap between arrivals, not a fixed window, matters under load:
when a forward ends, its clients' next requests arrive spread over the time
the server takes to parse them, and a fixed 2 ms window would cut that wave
into one tiny batch and a big one. A lone client, whose forwards are never
shared, pays no wait at all: its request goes straight to the backbone, and
requests that arrive during that forward form the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openbook.classifier import Prediction
from openbook.prompting import TextInput

from services.api.tasks import TaskRuntime

Result = tuple[list[Prediction], str, str]  # predictions, model version, store version


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
    ) -> None:
        self.runtime = runtime
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_delay = max(max_delay, max_wait)
        self.on_forward = on_forward
        self.queue: asyncio.Queue[_Request] = asyncio.Queue()
        self.last_shared = False  # whether the previous forward served more than one request
        self.consumer = asyncio.create_task(self._consume())

    async def predict(self, texts: Sequence[TextInput]) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Request(texts, future))
        return await future

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            size = len(batch[0].texts)
            while size < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
                size += len(batch[-1].texts)
            deadline = loop.time() + self.max_delay
            under_load = self.last_shared or len(batch) > 1
            while under_load and size < self.max_batch and (remaining := deadline - loop.time()) > 0:
                try:
                    request = await asyncio.wait_for(self.queue.get(), min(self.max_wait, remaining))
                except TimeoutError:
                    break
                batch.append(request)
                size += len(request.texts)
            self.last_shared = len(batch) > 1
            texts = [text for request in batch for text in request.texts]
            if self.on_forward is not None:
                self.on_forward(len(texts))
            try:
                predictions, model_version, store_version = await asyncio.to_thread(
                    self.runtime.predict, texts
                )
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
