"""Micro-batching: concurrent classify requests for a task share one backbone forward.

A request's texts join a queue; one consumer per task takes the first waiting
request and every request already queued behind it. If the previous forward
was shared by several requests (the service is under concurrent load), it
then waits for more, for at most `max_delay` seconds after the first: until
as many requests as the previous forward served have come, and after that
while they keep arriving less than `max_wait` seconds apart. It runs a single
`predict` in a worker thread and hands each request its slice. The event loop
never waits on the model.

A forward is bounded by what it costs the device. Its texts are padded to the
longest prompt, so it costs `texts x longest prompt` tokens; a batch closes
when adding the next request would take it over `max_tokens` (padded) or over
`max_texts`, and that request opens the next batch. A request over either
bound on its own still runs, alone. On a GPU the forward is launch-bound below
a few hundred prompts (H100, fp32: 1 / 32 / 256 / 1024 prompts in 31 / 45 /
42 / 62 ms), so there the bound that matters is tokens, i.e. memory, not a
count of texts; on a CPU the forward costs in proportion to its tokens
anyway, and `max_texts` alone bounds it (`max_tokens=None`: nothing is
counted). A request's texts are tokenized by the task's prompt encoder in a
worker thread started when the request arrives, so the tokenizer never runs
on the event loop, and its longest prompt is measured on those tokens (the
very layout the forward pads: the template and special tokens count, and
truncation to max_length is applied). The forward reads the same tokens, so
a text is tokenized once (`PromptEncoder.tokenize`); only a classifier
swapped meanwhile for one on another tokenizer tokenizes them again. The
runtime's classifier still splits a forward into chunks of its `batch_size`
(32) prompts, sorted by length; a budget of hundreds of prompts becomes one
GPU forward only where that is raised to match.

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

Tasks whose LoRA adapters sit on one shared backbone share a queue too (a
lane per backbone, `Batchers.batcher_for`): a forward then holds the requests
of several tasks, and runs their rows as one mixed-adapter forward
(`openbook.mixed`, `runtime.predict_together`). Every other task has a queue
of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openbook.mixed import MixedForward
from openbook.prompting import TextInput, join_texts

from services.engine.runtime import Result, TaskRuntime, predict_together

Offload = Callable[..., Awaitable[Any]]  # runs a blocking call in a worker thread: offload(fn, *args)


def tokenize(runtime: TaskRuntime, texts: Sequence[TextInput]) -> tuple[Sequence[TextInput], int]:
    """`texts` tokenized by the task's prompt encoder, for the forward to read, and the tokens in the
    longest of their prompts (blocking)."""
    encoder = runtime.classifier.encoder
    tokenized = encoder.tokenize(texts)
    return tokenized, int(encoder.prompt_lengths(tokenized).max())


@dataclass
class _Request:
    runtime: TaskRuntime
    texts: Sequence[TextInput]  # tokenized once counted (`tokenize`)
    future: asyncio.Future[Result]
    # the texts tokenized and the tokens in the longest prompt, being counted; None: nothing is counted
    tokenized: asyncio.Future[tuple[Sequence[TextInput], int]] | None = None


@dataclass
class _Batch:
    """The requests that will share one forward, and what they make it cost."""

    requests: list[_Request] = field(default_factory=list)
    texts: int = 0
    longest: int = 0  # tokens in the longest prompt; 0 when nothing is counted


class MicroBatcher:
    """The queue of one task (`runtime`), or of the LoRA tasks on one backbone (`mixer`, no runtime)."""

    def __init__(
        self,
        runtime: TaskRuntime | None,
        *,
        mixer: MixedForward | None = None,
        max_texts: int,  # texts per forward
        max_tokens: int | None,  # texts x longest prompt per forward (the padded tokens); None: not counted
        max_wait: float,  # the longest gap between two arrivals that still joins them in one forward
        max_delay: float,  # the longest a request waits for others
        on_forward: Callable[[int], None] | None = None,  # texts per forward, for the metrics
        offload: Offload = asyncio.to_thread,
    ) -> None:
        self.runtime = runtime
        self.mixer = mixer
        self.offload = offload
        self.max_texts = max_texts
        self.max_tokens = max_tokens
        self.max_wait = max_wait
        self.max_delay = max(max_delay, max_wait)
        self.on_forward = on_forward
        self.queue: asyncio.Queue[_Request | None] = asyncio.Queue()  # None: retire after what is queued
        self.last_requests = 0  # requests the previous forward served
        self.consumer = asyncio.create_task(self._consume())

    async def predict(self, texts: Sequence[TextInput], runtime: TaskRuntime | None = None) -> Result:
        """`texts`' predictions by `runtime`'s task (a task's own queue: its runtime by default)."""
        runtime = runtime or self.runtime
        if runtime is None:
            raise ValueError("a shared queue needs the runtime of each request's task")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        tokenized = None
        if self.max_tokens is not None:  # counted while the request waits in the queue
            tokenized = asyncio.ensure_future(self.offload(tokenize, runtime, texts))
        await self.queue.put(_Request(runtime, texts, future, tokenized))
        return await future

    def retire(self) -> None:
        """Answer the requests already queued, then stop: another batcher has taken over the task."""
        self.queue.put_nowait(None)

    def _fits(self, batch: _Batch, texts: int, longest: int) -> bool:
        """Whether `texts` more texts, the longest prompt among them `longest` tokens, fit in `batch`."""
        total = batch.texts + texts
        if total > self.max_texts:
            return False
        return self.max_tokens is None or total * max(batch.longest, longest) <= self.max_tokens

    def _full(self, batch: _Batch) -> bool:
        return not self._fits(batch, 1, 0)  # not even one text as long as its longest would fit

    async def _offer(self, batch: _Batch, request: _Request) -> bool:
        """Add `request` to `batch` if it fits (an empty batch takes any); False: it opens the next batch."""
        longest = 0
        if request.tokenized is not None:
            try:
                request.texts, longest = await request.tokenized
            except Exception as error:  # texts the encoder refuses could not be classified: fail alone
                if not request.future.done():
                    request.future.set_exception(error)
                return True
        if batch.requests and not self._fits(batch, len(request.texts), longest):
            return False
        batch.requests.append(request)
        batch.texts += len(request.texts)
        batch.longest = max(batch.longest, longest)
        return True

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        retiring = False
        held: _Request | None = None  # a request that did not fit the previous batch: it opens this one
        while not retiring:  # a request is held only while the queue is read, so never past its end
            first = held if held is not None else await self.queue.get()
            held = None
            if first is None:
                return
            batch = _Batch()
            await self._offer(batch, first)
            while not self._full(batch) and not self.queue.empty() and not retiring:
                request = self.queue.get_nowait()
                if request is None:
                    retiring = True
                elif not await self._offer(batch, request):
                    held = request
                    break
            deadline = loop.time() + self.max_delay
            under_load = self.last_requests > 1 or len(batch.requests) > 1
            while (
                under_load
                and held is None
                and not retiring
                and not self._full(batch)
                and (remaining := deadline - loop.time()) > 0
            ):
                # Until as many requests as last time have come, wait up to max_delay for the next one;
                # after that, only while they keep arriving less than max_wait apart.
                patience = (
                    remaining if len(batch.requests) < self.last_requests else min(self.max_wait, remaining)
                )
                try:
                    request = await asyncio.wait_for(self.queue.get(), patience)
                except TimeoutError:
                    break
                if request is None:
                    retiring = True
                elif not await self._offer(batch, request):
                    held = request
            if batch.requests:
                await self._forward(batch.requests)

    async def _forward(self, batch: list[_Request]) -> None:
        self.last_requests = len(batch)
        if self.on_forward is not None:
            self.on_forward(sum(len(request.texts) for request in batch))
        by_task: dict[int, list[_Request]] = {}  # the requests of each task, tasks in order of arrival
        for request in batch:
            by_task.setdefault(id(request.runtime), []).append(request)
        groups = list(by_task.values())
        parts = [(group[0].runtime, join_texts([r.texts for r in group])) for group in groups]
        try:
            if len(parts) == 1 or self.mixer is None:
                results: list[Result | Exception] = [await self.offload(parts[0][0].predict, parts[0][1])]
            else:
                results = await self.offload(predict_together, self.mixer, parts)
        except Exception as error:  # every waiting request gets the error, the consumer lives on
            results = [error] * len(groups)
        for group, result in zip(groups, results, strict=True):
            _answer(group, result)

    async def close(self) -> None:
        self.consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.consumer


def _answer(requests: list[_Request], result: Result | Exception) -> None:
    """Hand each of one task's requests its slice of the task's predictions (or the error)."""
    start = 0
    for request in requests:
        end = start + len(request.texts)
        if not request.future.done():
            if isinstance(result, Exception):
                request.future.set_exception(result)
            else:
                predictions, model_version, store_version = result
                request.future.set_result((predictions[start:end], model_version, store_version))
        start = end


MIXED_LANE = "/mixed/"  # prefix of a shared queue's key; no task name has a slash (task_spec)


class Batchers:
    """One MicroBatcher per task, replaced when the task's runtime is (a task deleted and re-created);
    one per shared backbone for the tasks whose LoRA adapters mix on it."""

    def __init__(self, **options: Any) -> None:
        self.options = options  # MicroBatcher's keyword arguments
        self.batchers: dict[str, MicroBatcher] = {}
        self.retiring: set[asyncio.Task] = set()  # asyncio keeps only weak references to tasks

    def batcher_for(self, runtime: TaskRuntime) -> MicroBatcher:
        if runtime.mixer is not None and runtime.mixes():
            lane = f"{MIXED_LANE}{id(runtime.mixer)}"
            shared = self.batchers.get(lane)
            if shared is None:
                shared = self.batchers[lane] = MicroBatcher(None, mixer=runtime.mixer, **self.options)
            return shared
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
