"""The micro-batcher: a lone request goes straight to the backbone; under concurrent load, arrivals
closer than max_wait share a forward, up to max_delay, max_texts and max_tokens (texts x longest prompt)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.api.settings import Settings
from services.engine.batching import MicroBatcher, tokenize
from tests.services.harness import TASK


class WordEncoder:
    """Stands in for a PromptEncoder: a text's prompt has one token per word; `bad` cannot be tokenized."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def tokenize(self, texts: list[str]) -> list[str]:
        self.threads.add(threading.get_ident())
        if "bad" in texts:
            raise ValueError("cannot tokenize 'bad'")
        return list(texts)

    def prompt_lengths(self, texts: list[str]) -> np.ndarray:
        return np.array([len(text.split()) for text in texts])


class RecordingRuntime:
    """Stands in for a TaskRuntime: records each forward's texts and start time, and echoes them back."""

    def __init__(self) -> None:
        self.forwards: list[list[str]] = []
        self.started: list[float] = []
        self.classifier = SimpleNamespace(encoder=WordEncoder())

    def predict(self, texts: list[str]) -> tuple[list[Any], str, str]:
        self.started.append(time.monotonic())
        self.forwards.append(list(texts))
        return list(texts), "base", "0-0"


def _run(
    requests: list[tuple[float, list[str]]],  # (ms after the previous request, its texts)
    *,
    max_wait_ms: float,
    max_delay_ms: float,
    max_texts: int = 64,
    max_tokens: int | None = None,
) -> tuple[list[Any], RecordingRuntime, list[float]]:
    """Each request's result, the runtime (its forwards), and when each request was sent."""
    runtime = RecordingRuntime()
    sent: list[float] = [0.0] * len(requests)

    async def main() -> list[Any]:
        batcher = MicroBatcher(
            runtime,  # type: ignore[arg-type]
            max_texts=max_texts,
            max_tokens=max_tokens,
            max_wait=max_wait_ms / 1000,
            max_delay=max_delay_ms / 1000,
        )

        async def ask(i: int, delay: float, texts: list[str]) -> Any:
            await asyncio.sleep(delay)
            sent[i] = time.monotonic()
            try:
                return await batcher.predict(texts)
            except ValueError as error:
                return error

        delays = [sum(gap for gap, _ in requests[: i + 1]) / 1000 for i in range(len(requests))]
        asked = (ask(i, d, r[1]) for i, (d, r) in enumerate(zip(delays, requests, strict=True)))
        results = await asyncio.wait_for(asyncio.gather(*asked), 10.0)  # a request never answered fails
        await batcher.close()
        return results

    return asyncio.run(main()), runtime, sent


def _singles(gaps_ms: list[float], **options: Any) -> tuple[list[Any], list[list[str]]]:
    """One text per request, `t0`, `t1`, ..."""
    results, runtime, _ = _run([(gap, [f"t{i}"]) for i, gap in enumerate(gaps_ms)], **options)
    return results, runtime.forwards


def _words(n: int, tag: str) -> str:
    return " ".join([tag] * n)  # a prompt of n tokens for WordEncoder


def test_a_lone_request_does_not_wait_for_company() -> None:
    # max_wait is 60 ms, but nothing has shared a forward yet: each request is served on arrival.
    results, forwards = _singles([0, 150, 150], max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0"], ["t1"], ["t2"]]
    assert [r[0] for r in results] == [["t0"], ["t1"], ["t2"]]


@pytest.mark.parametrize("max_tokens", [None, 1000])
def test_a_lone_request_goes_straight_to_the_backbone(max_tokens: int | None) -> None:
    # With max_wait 300 ms, a lone request that waited for company would start its forward 300 ms late.
    requests = [(0.0, ["a b c"]), (400.0, ["d e"])]
    _, runtime, sent = _run(requests, max_wait_ms=300, max_delay_ms=1000, max_tokens=max_tokens)
    assert runtime.forwards == [["a b c"], ["d e"]]
    assert all(started - at < 0.15 for started, at in zip(runtime.started, sent, strict=True))


def test_under_load_a_steady_stream_shares_one_forward_beyond_the_gap() -> None:
    # Two requests at once share a forward; after that, eight arrivals 20 ms apart (each gap under
    # max_wait, the whole stream over it) are waited for and share the next one.
    results, forwards = _singles([0, 0, 100] + [20] * 7, max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0", "t1"], [f"t{i}" for i in range(2, 10)]]
    assert [r[0] for r in results] == [[f"t{i}"] for i in range(10)]  # each request gets its own slice


def test_a_gap_longer_than_max_wait_starts_a_new_forward() -> None:
    _, forwards = _singles([0, 0, 100, 10, 300, 10], max_wait_ms=60, max_delay_ms=1000)
    assert forwards == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]


def test_max_delay_and_max_texts_bound_a_forward() -> None:
    _, by_delay = _singles([0, 0, 100] + [40] * 5, max_wait_ms=100, max_delay_ms=100)
    assert len(by_delay) >= 3 and len(by_delay[1]) <= 4  # cut at ~100 ms although arrivals kept coming
    _, by_size = _singles([0] * 5, max_wait_ms=500, max_delay_ms=500, max_texts=2)
    assert [len(f) for f in by_size] == [2, 2, 1]


def test_a_request_that_would_pass_max_texts_opens_the_next_forward() -> None:
    requests = [(0.0, ["a", "b"]), (0.0, ["c", "d"]), (0.0, ["e"])]
    results, runtime, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_texts=3)
    assert runtime.forwards == [["a", "b"], ["c", "d", "e"]]  # not a, b, c, d: four texts
    assert [r[0] for r in results] == [["a", "b"], ["c", "d"], ["e"]]


def test_under_load_a_wave_as_big_as_the_last_forward_is_waited_for_across_gaps() -> None:
    # Three requests share a forward; the next wave of three arrives with gaps (80 ms) over max_wait
    # (30 ms) but within max_delay: it is waited for, because the last forward served three.
    _, forwards = _singles([0, 0, 0, 100, 80, 80], max_wait_ms=30, max_delay_ms=1000)
    assert forwards == [["t0", "t1", "t2"], ["t3", "t4", "t5"]]
    # With max_delay shorter than the wave, the forward goes when max_delay is up.
    _, cut = _singles([0, 0, 0, 100, 80, 80], max_wait_ms=30, max_delay_ms=120)
    assert cut[0] == ["t0", "t1", "t2"] and cut[1] == ["t3", "t4"]


def test_a_batch_closes_at_the_token_budget() -> None:
    # Padded cost = texts x longest prompt. Three 2-token prompts cost 6; a 10-token one would make it
    # 4 x 10 = 40 > 30, so it opens the next forward, which the short one after it joins (2 x 10 = 20).
    short, long = _words(2, "s"), _words(10, "L")
    requests = [(0.0, [short]), (0.0, [short]), (0.0, [short]), (0.0, [long]), (0.0, [short])]
    results, runtime, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_tokens=30)
    assert runtime.forwards == [[short] * 3, [long, short]]
    assert [r[0] for r in results] == [[text] for _, (text,) in requests]
    # Without a token budget the same arrivals share one forward: the budget is what split them.
    _, unbounded, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_tokens=None)
    assert unbounded.forwards == [[short] * 3 + [long, short]]


def test_a_long_request_behind_short_ones_waits_for_the_next_forward_in_order() -> None:
    # Budget 40: a, b (4 tokens each, 2 x 4 = 8) then a 3-text request of 8 tokens (5 x 8 = 40) fits;
    # the next short request would make 6 x 8 = 48 and goes on to the next forward.
    a, b, c = _words(4, "a"), _words(4, "b"), _words(3, "c")
    long = [_words(8, f"l{i}") for i in range(3)]
    requests = [(0.0, [a]), (0.0, [b]), (0.0, long), (0.0, [c])]
    results, runtime, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_tokens=40)
    assert runtime.forwards == [[a, b, *long], [c]]
    assert [r[0] for r in results] == [[a], [b], long, [c]]


def test_a_request_over_the_budget_on_its_own_runs_alone() -> None:
    # 4 texts x 10 tokens = 40 > 30: it cannot share, but it still runs, by itself.
    big = [_words(10, f"b{i}") for i in range(4)]
    requests = [(0.0, ["x"]), (0.0, big), (0.0, ["y"])]
    results, runtime, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_tokens=30)
    assert runtime.forwards == [["x"], big, ["y"]]
    assert [r[0] for r in results] == [["x"], big, ["y"]]


def test_prompts_are_counted_off_the_event_loop_and_a_refused_one_fails_alone() -> None:
    requests = [(0.0, ["a"]), (0.0, ["bad"]), (0.0, ["b c"])]
    results, runtime, _ = _run(requests, max_wait_ms=50, max_delay_ms=50, max_tokens=100)
    assert (
        runtime.classifier.encoder.threads and threading.get_ident() not in runtime.classifier.encoder.threads
    )
    assert isinstance(results[1], ValueError)
    assert runtime.forwards == [["a", "b c"]]
    assert results[0][0] == ["a"] and results[2][0] == ["b c"]


def test_the_cpu_defaults_batch_as_before_and_cuda_defaults_count_tokens(monkeypatch) -> None:
    monkeypatch.delenv("OPENBOOK_BATCH_MAX_TOKENS", raising=False)
    monkeypatch.delenv("OPENBOOK_BATCH_MAX_TEXTS", raising=False)
    cpu = Settings(device="cpu")
    assert (cpu.batch_max_texts, cpu.batch_max_tokens) == (64, None)
    cuda = Settings(device="cuda:1")
    assert (cuda.batch_max_texts, cuda.batch_max_tokens) == (1024, 16384)
    monkeypatch.setenv("OPENBOOK_BATCH_MAX_TOKENS", "4096")
    assert Settings(device="cuda").batch_max_tokens == 4096  # what is set is kept
    assert Settings(device="cpu", batch_max_texts=32).batch_max_texts == 32
    # The compositions the batcher formed before the budget, for 70 one-text requests at once, then a
    # wave of one-text and three-text requests: the CPU defaults reproduce them.
    options = {
        "max_texts": cpu.batch_max_texts,
        "max_tokens": cpu.batch_max_tokens,
        "max_wait_ms": cpu.batch_max_wait_ms,
        "max_delay_ms": cpu.batch_max_delay_ms,
    }
    _, forwards = _singles([0] * 70, **options)
    assert [len(f) for f in forwards] == [64, 6]
    requests = [(0.0, ["a"]), (0.0, ["b", "c", "d"]), (100.0, ["e", "f", "g"]), (0.0, ["h"]), (0.0, ["i"])]
    _, runtime, _ = _run(requests, **options)
    assert runtime.forwards == [["a", "b", "c", "d"], ["e", "f", "g", "h", "i"]]


def test_the_longest_prompt_is_the_padded_width_of_the_real_encoder(
    fresh_classifier, causal_dir: Path
) -> None:
    classifier, _ = fresh_classifier(causal_dir, "prompt-ft")
    runtime = SimpleNamespace(classifier=classifier)
    texts = ["yes", "the movie was great and fun", "the plot was okay , not good , not bad " * 20]
    alone = [int(classifier.encoder.encode([t]).attention_mask.sum()) for t in texts]
    assert alone[0] < alone[1] < alone[2] == classifier.encoder.max_length  # the long one is cut to fit
    tokenized, longest = tokenize(runtime, texts[:2])  # type: ignore[arg-type]
    assert longest == alone[1] and list(tokenized) == texts[:2]  # padding does not count, the longest does
    assert tokenize(runtime, texts)[1] == alone[2]  # type: ignore[arg-type]


def test_a_retired_batcher_answers_what_it_holds_then_stops() -> None:
    runtime = RecordingRuntime()

    async def main() -> tuple[list[Any], bool]:
        batcher = MicroBatcher(runtime, max_texts=64, max_tokens=None, max_wait=0.05, max_delay=0.05)  # type: ignore[arg-type]
        waiting = [asyncio.ensure_future(batcher.predict([f"t{i}"])) for i in range(3)]
        await asyncio.sleep(0)  # the three are queued
        batcher.retire()
        results = await asyncio.gather(*waiting)
        await asyncio.wait_for(batcher.consumer, 1.0)  # it ends by itself
        return results, batcher.consumer.done()

    results, stopped = asyncio.run(main())
    assert [r[0] for r in results] == [["t0"], ["t1"], ["t2"]] and stopped
    assert sorted(t for forward in runtime.forwards for t in forward) == ["t0", "t1", "t2"]


def test_a_retired_batcher_also_answers_a_request_held_over_the_budget() -> None:
    runtime = RecordingRuntime()

    async def main() -> list[Any]:
        batcher = MicroBatcher(runtime, max_texts=2, max_tokens=None, max_wait=0.05, max_delay=0.05)  # type: ignore[arg-type]
        asked = [["t0"], ["t1", "t2"], ["t3"]]  # the second would make three texts: held for the next forward
        waiting = [asyncio.ensure_future(batcher.predict(texts)) for texts in asked]
        await asyncio.sleep(0)
        batcher.retire()
        results = await asyncio.wait_for(asyncio.gather(*waiting), 2.0)
        await asyncio.wait_for(batcher.consumer, 1.0)
        return results

    results = asyncio.run(main())
    assert [r[0] for r in results] == [["t0"], ["t1", "t2"], ["t3"]]
    assert runtime.forwards == [["t0"], ["t1", "t2"], ["t3"]]


def test_the_api_counts_with_the_task_encoder_and_answers_each_request_its_own(make_client) -> None:
    # Through the app: prompts counted by the task's encoder in the read pool, a 60-token budget (the
    # second request, two prompts of ~35 tokens, is over it alone); each request, whichever forward it
    # shared, gets the predictions of its own texts, as when it was alone.
    texts = [
        ["a good film"],
        ["it was terrible and boring " * 6, "yes"],
        ["no"],
        ["a bad film , it was awful"],
    ]
    with make_client(batch_max_tokens=60) as client:
        assert client.app.state.settings.batch_max_tokens == 60
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        classify = lambda batch: client.post("/v1/tasks/reviews/classify", json={"texts": batch}).json()  # noqa: E731
        alone = [classify(batch)["predictions"] for batch in texts]
        with ThreadPoolExecutor(len(texts)) as pool:
            together = [answer["predictions"] for answer in pool.map(classify, texts * 3)]
    for got, expected in zip(together, alone * 3, strict=True):
        assert [p["probabilities"] for p in got] == [
            pytest.approx(p["probabilities"], abs=1e-5) for p in expected
        ]


def test_a_classified_text_is_tokenized_once_when_its_prompt_is_counted(make_client, count_tokenized) -> None:
    # With a token budget the batcher tokenizes each request to size its forward; the forward reads
    # those tokens, so no text is tokenized twice, whichever forward it shared.
    batches = [["a good film"], ["it was terrible and boring " * 6, "yes"], ["no"], ["great fun", "so so"]]
    with make_client(batch_max_tokens=60) as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        classify = lambda batch: client.post("/v1/tasks/reviews/classify", json={"texts": batch})  # noqa: E731
        assert classify(["warm up"]).status_code == 200  # the task's runtime is built
        runtime = client.app.state.runtimes.loaded["reviews"]
        seen = count_tokenized(runtime.classifier.encoder.tokenizer)
        with ThreadPoolExecutor(len(batches)) as pool:
            assert all(r.status_code == 200 for r in pool.map(classify, batches))
    texts = [text.strip() for batch in batches for text in batch]
    assert {text: seen[text] for text in texts} == dict.fromkeys(texts, 1)
