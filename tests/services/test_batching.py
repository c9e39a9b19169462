"""The micro-batcher: a lone request goes straight to the backbone; under concurrent load, arrivals
closer than max_wait share a forward, up to max_delay and max_batch."""

from __future__ import annotations

import asyncio
from typing import Any

from services.api.batching import MicroBatcher


class RecordingRuntime:
    """Stands in for a TaskRuntime: records each forward's texts and echoes them back."""

    def __init__(self) -> None:
        self.forwards: list[list[str]] = []

    def predict(self, texts: list[str]) -> tuple[list[Any], str, str]:
        self.forwards.append(list(texts))
        return list(texts), "base", "0-0"


async def _arrivals(batcher: MicroBatcher, gaps_ms: list[float]) -> list[Any]:
    async def ask(delay: float, text: str) -> Any:
        await asyncio.sleep(delay)
        return await batcher.predict([text])

    delays = [sum(gaps_ms[: i + 1]) / 1000 for i in range(len(gaps_ms))]
    results = await asyncio.gather(*(ask(d, f"t{i}") for i, d in enumerate(delays)))
    await batcher.close()
    return results


def _run(gaps_ms: list[float], *, max_wait_ms: float, max_delay_ms: float, max_batch: int = 64):
    runtime = RecordingRuntime()

    async def main() -> list[Any]:
        batcher = MicroBatcher(
            runtime,  # type: ignore[arg-type]
            max_batch=max_batch,
            max_wait=max_wait_ms / 1000,
            max_delay=max_delay_ms / 1000,
        )
        return await _arrivals(batcher, gaps_ms)

    return asyncio.run(main()), runtime.forwards


def test_a_lone_request_does_not_wait_for_company() -> None:
    # max_wait is 60 ms, but nothing has shared a forward yet: each request is served on arrival.
    results, forwards = _run([0, 150, 150], max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0"], ["t1"], ["t2"]]
    assert [r[0] for r in results] == [["t0"], ["t1"], ["t2"]]


def test_under_load_a_steady_stream_shares_one_forward_beyond_the_gap() -> None:
    # Two requests at once share a forward; after that, eight arrivals 20 ms apart (each gap under
    # max_wait, the whole stream over it) are waited for and share the next one.
    results, forwards = _run([0, 0, 100] + [20] * 7, max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0", "t1"], [f"t{i}" for i in range(2, 10)]]
    assert [r[0] for r in results] == [[f"t{i}"] for i in range(10)]  # each request gets its own slice


def test_a_gap_longer_than_max_wait_starts_a_new_forward() -> None:
    _, forwards = _run([0, 0, 100, 10, 300, 10], max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]


def test_max_delay_and_max_batch_bound_a_forward() -> None:
    _, by_delay = _run([0, 0, 100] + [40] * 5, max_wait_ms=100, max_delay_ms=100)
    assert len(by_delay) >= 3 and len(by_delay[1]) <= 4  # cut at ~100 ms although arrivals kept coming
    _, by_size = _run([0] * 5, max_wait_ms=500, max_delay_ms=500, max_batch=2)
    assert [len(f) for f in by_size] == [2, 2, 1]


def test_under_load_a_wave_as_big_as_the_last_forward_is_waited_for_across_gaps() -> None:
    # Three requests share a forward; the next wave of three arrives with gaps (80 ms) over max_wait
    # (30 ms) but within max_delay: it is waited for, because the last forward served three.
    _, forwards = _run([0, 0, 0, 100, 80, 80], max_wait_ms=30, max_delay_ms=1000)
    assert forwards == [["t0", "t1", "t2"], ["t3", "t4", "t5"]]
    # With max_delay shorter than the wave, the forward goes when max_delay is up.
    _, cut = _run([0, 0, 0, 100, 80, 80], max_wait_ms=30, max_delay_ms=120)
    assert cut[0] == ["t0", "t1", "t2"] and cut[1] == ["t3", "t4"]


def test_a_retired_batcher_answers_what_it_holds_then_stops() -> None:
    runtime = RecordingRuntime()

    async def main() -> tuple[list[Any], bool]:
        batcher = MicroBatcher(runtime, max_batch=64, max_wait=0.05, max_delay=0.05)  # type: ignore[arg-type]
        waiting = [asyncio.ensure_future(batcher.predict([f"t{i}"])) for i in range(3)]
        await asyncio.sleep(0)  # the three are queued
        batcher.retire()
        results = await asyncio.gather(*waiting)
        await asyncio.wait_for(batcher.consumer, 1.0)  # it ends by itself
        return results, batcher.consumer.done()

    results, stopped = asyncio.run(main())
    assert [r[0] for r in results] == [["t0"], ["t1"], ["t2"]] and stopped
    assert sorted(t for forward in runtime.forwards for t in forward) == ["t0", "t1", "t2"]
