"""`openbook bench api`: the service's overheads as measured ratios (nothing passes or fails).

Runs the real stack in-process: the embedded Redis, the api under uvicorn on
a local port (real HTTP), and the trainer worker, on the chosen backbone.

1. latency: one classify request of one text vs a bare backbone forward of the same prompt;
2. throughput: N concurrent clients (32, or each of `--clients`) vs the bare batched forward of the
   same texts (batches of N, or of the micro-batcher's bound on texts per forward if smaller);
3. freshness: from sending a POST of one example to its acknowledgement, after which the next
   classify on the replica sees it, vs one bare forward of that example's text + 20 ms;
4. hot swap under load: failed requests while a trained checkpoint is swapped in, and the time from
   publishing to the first response served by the new version;
5. replicas: two api replicas on one Redis, after a burst of POSTs and the swap, hold the same ids and,
   once both serve the swapped-in version, give the same predictions.

With `workers` (`--workers 1,2,4`), 1-3 are measured once per count: 1 on the in-process api as above,
N > 1 on `openbook serve` with N api processes behind one port (services/api/api_workers.py), in a
process of its own on the same Redis, task and settings; the bare references still run in the bench's
process. 4 and 5 run on the in-process replicas, after the last count, when 1 is among the counts.
With `fronts` (`--fronts 0,2`), each count F > 0 measures 1-3 again on `openbook serve` with F front
processes (services/api/front.py) before the replica and its workers, for each count of workers.

On a GPU every bare forward is timed to the end of its kernels (`torch.cuda.synchronize`); a served
request ends with its results on the host, which waits for them anyway.
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
import torch
from openbook.backbone import BackboneConfig
from openbook.classifier import Classifier
from openbook.prompting import EncodedBatch
from openbook.timing import median_seconds, synchronize, synthetic_sentences

from services.api.settings import Settings
from services.bench_http import classify_one, connect, forward_counts, post, seconds, with_clients
from services.bench_stack import Served, ServedWorkers, make_stand_in
from services.bus.server import EmbeddedRedis, free_port
from services.trainer.worker import Worker

TASK = {
    "name": "bench",
    "template": "Review: {text}\nSentiment: {mask}",
    "labels": {"0": "negative", "1": "positive"},
    "reader": "none",  # the prompt and its slot store alone; `--reader` measures a reader's task against it
    "training": {
        "auto": False
    },  # the one job is the hot swap's: an automatic one would take the worker first
}


@dataclass
class _Bench:
    """The stack every measurement runs on: one api replica with the `bench` task and 64 examples."""

    bus_url: str
    tmp: Path
    settings: Callable[[], Settings]  # settings for another replica on the same bus
    first: Served
    api: httpx.Client
    classifier: Classifier
    text: str  # the single text the latency and hot-swap measurements send

    def bare_forward(self, batch: EncodedBatch) -> Callable[[], None]:
        """One backbone forward of `batch`, returning once the device has finished it."""
        backbone = self.classifier.backbone

        def run() -> None:
            with torch.inference_mode():
                backbone.forward(batch, self.classifier.encoder.label_token_ids)
            synchronize(backbone.device)

        return run


def run_api_bench(
    backbone: str,
    *,
    max_length: int = BackboneConfig.max_length,
    requests: int = 20,
    clients: int | Sequence[int] = (32,),
    stand_in: bool = False,
    workers: Sequence[int] = (1,),
    fronts: Sequence[int] = (0,),
    reader: str | None = None,
    hot_swap: bool = True,
) -> None:
    """`clients`: one throughput measurement per count, e.g. (32, 256).

    `stand_in`: serve `make_stand_in`'s model of `backbone` instead of `backbone` itself.
    `workers`: api processes behind the port, one group of measurements per count (the module's docstring).
    `fronts`: front processes before them, one group per count of fronts and of workers; 0: none.
    `reader`: a sentence encoder; a task keyed by it is measured against `bench` (`measure_reader_cost`).
    `hot_swap`: with 1 in `workers`, the hot swap under load and the two replicas' comparison.
    """
    client_counts = [clients] if isinstance(clients, int) else list(clients)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as bus:
        if stand_in:
            print(f"serving a stand-in: {backbone}'s tokenizer, 2 layers of width 64, random weights")
            backbone = make_stand_in(backbone, Path(tmp) / "stand-in")

        def settings() -> Settings:
            return Settings(
                redis_url=bus.url, default_backbone=backbone, max_length=max_length, port=free_port()
            )

        first = Served(settings())
        api = httpx.Client(base_url=first.base, timeout=600)
        api.post("/v1/tasks", json=TASK).raise_for_status()
        seed_texts = synthetic_sentences(64, seed=3)
        examples = [{"text": t, "label": str(i % 2), "id": i} for i, t in enumerate(seed_texts)]
        api.post("/v1/tasks/bench/examples", json={"examples": examples}).raise_for_status()
        classifier = first.app.state.runtimes.loaded["bench"].classifier
        text = synthetic_sentences(1, seed=7)[0]
        bench = _Bench(bus.url, Path(tmp), settings, first, api, classifier, text)
        measured: dict[int, tuple[float, float]] = {}  # workers -> (latency ratio, most clients' texts/s)
        groups = [(count, front) for front in fronts for count in workers]
        for group, (count, front) in enumerate(groups):
            if groups != [(1, 0)]:
                where = " (in-process)" if (count, front) == (1, 0) else " (openbook serve)"
                print(f"api workers: {count}" + (f", fronts: {front}" if front else "") + where)
            served_apart = count > 1 or front > 0
            log = Path(tmp) / "serve.log"
            pool = ServedWorkers(settings(), count, log, fronts=front) if served_apart else None
            base = pool.base if pool else first.base
            latency = measure_latency(bench, requests, base)
            rates = [measure_throughput(bench, clients_count, base) for clients_count in client_counts]
            if not front:
                measured[count] = (latency, rates[-1])
            measure_freshness(bench, base, group)
            if pool:
                pool.stop()
        if len(measured) > 1:
            print(choose_workers(measured, client_counts[-1]))
        if reader is not None:
            measure_reader_cost(bench, reader, requests, client_counts[-1])
        if hot_swap and 1 in workers:
            second = Served(settings())
            measure_hot_swap(bench, second, max_length)
            measure_replicas(bench, second)
            second.stop()
        api.close()
        first.stop()


# The latency target a worker count must keep to be chosen (docs/benchmarks.md, the GPU targets).
LATENCY_TARGET = 1.15


def choose_workers(measured: dict[int, tuple[float, float]], clients: int) -> str:
    """The rule for `OPENBOOK_API_WORKERS`' default on a device, applied to one run's figures: the most
    texts/s at the largest client count among the counts whose one-request latency keeps within
    LATENCY_TARGET x a bare forward; the fewest workers if none does (each costs a model copy)."""
    within = {count: rate for count, (latency, rate) in measured.items() if latency <= LATENCY_TARGET}
    if not within:
        return (
            f"workers: none of {sorted(measured)} keeps latency within {LATENCY_TARGET}x; the rule "
            f"keeps {min(measured)}"
        )
    best = max(within, key=lambda count: (within[count], -count))
    return (
        f"workers: {best} by the rule (most texts/s at {clients} clients, latency within "
        f"{LATENCY_TARGET}x): "
        + ", ".join(f"{count} -> {rate:.1f}" for count, rate in sorted(within.items()))
    )


def measure_latency(bench: _Bench, requests: int, base: str) -> float:
    """One classify request of one text to the api at `base` vs a bare backbone forward of the same prompt."""
    bare_one = bench.bare_forward(bench.classifier.encoder.encode([bench.text]))
    # Bare forwards and requests alternate, so a drift in the machine's speed hits both alike.
    lean = connect(base)
    bare_one()  # warm up
    classify_one(lean, bench.text)
    pairs = [(seconds(bare_one), seconds(lambda: classify_one(lean, bench.text))) for _ in range(requests)]
    lean.close()
    forward_s, request_s = (statistics.median(times) for times in zip(*pairs, strict=True))
    print(
        f"latency: one classify {request_s * 1e3:.1f} ms vs bare forward {forward_s * 1e3:.1f} ms"
        f" -> {request_s / forward_s:.2f}x"
    )
    return request_s / forward_s


def measure_throughput(bench: _Bench, clients: int, base: str) -> float:
    """`clients` concurrent clients of the api at `base` vs the bare batched forward of the same texts, in
    batches of the size the micro-batcher can form: `clients`, or its bound on texts per forward if that
    is smaller (a bare batch of 256 prompts pads to the longest of 256, and on a CPU runs slower per text
    than the batcher's 64)."""
    texts = synthetic_sentences(clients * 4, seed=13)
    size = min(clients, bench.first.app.state.settings.batch_max_texts)
    forwards_of_batches = [
        bench.bare_forward(bench.classifier.encoder.encode(texts[start : start + size]))
        for start in range(0, len(texts), size)
    ]

    def bare_batches() -> None:
        for forward in forwards_of_batches:
            forward()

    # Three rounds, each a bare pass over the texts then the clients sending them.
    bare_s = served_s = forwards = forwarded = 0.0
    spawn = multiprocessing.get_context("spawn")  # the clients never compete with the server's GIL
    with ProcessPoolExecutor(1, mp_context=spawn) as clients_process:
        clients_process.submit(with_clients, base, texts[:clients], clients).result()  # warm up connections
        # and the bare batches' shapes: a GPU's first forward at a shape (kernel choice, allocator
        # growth) is slower, and the served path has had its own warm-up just above
        bare_batches()
        for _ in range(3):
            bare_s += seconds(bare_batches)
            forwards_before, texts_before = forward_counts(base)
            served_s += clients_process.submit(with_clients, base, texts, clients).result()
            forwards_after, texts_after = forward_counts(base)
            forwards += forwards_after - forwards_before
            forwarded += texts_after - texts_before
    bare_rate, served_rate = 3 * len(texts) / bare_s, 3 * len(texts) / served_s
    print(
        f"throughput: {clients} clients {served_rate:.1f} texts/s vs bare batched forward"
        f" {bare_rate:.1f} texts/s in batches of {size} -> {served_rate / bare_rate:.2f}x"
        f" ({forwards:.0f} forwards of {forwarded / max(1, forwards):.1f} texts each)"
    )
    return served_rate


def measure_reader_cost(bench: _Bench, reader: str, requests: int, clients: int) -> None:
    """What a second reader costs a classify: the `bench` task and the same task keyed by `reader`, with
    the same examples, on the in-process api. One request of one text, the two tasks alternating on texts
    neither has seen (a text seen before would find its lower states in the reader's cache), then
    `clients` concurrent clients on each; the ratios are the reader's task over the other."""
    name = "bench-reader"
    bench.api.post("/v1/tasks", json={**TASK, "name": name, "reader": reader}).raise_for_status()
    examples = [
        {"text": t, "label": str(i % 2), "id": i} for i, t in enumerate(synthetic_sentences(64, seed=3))
    ]
    bench.api.post(f"/v1/tasks/{name}/examples", json={"examples": examples}).raise_for_status()
    lean = connect(bench.first.base)
    texts = synthetic_sentences(requests + 1, seed=29)
    for task in ("bench", name):  # warm up
        post(lean, f"/v1/tasks/{task}/classify", {"texts": [texts[0]]})

    def classify(task: str, text: str) -> float:
        return seconds(lambda: post(lean, f"/v1/tasks/{task}/classify", {"texts": [text]}))

    pairs = [(classify("bench", text), classify(name, text)) for text in texts[1:]]
    lean.close()
    without, with_reader = (statistics.median(times) for times in zip(*pairs, strict=True))
    print(
        f"reader {reader}: one classify {with_reader * 1e3:.1f} ms vs {without * 1e3:.1f} ms without"
        f" -> {with_reader / without:.2f}x"
    )
    spawn = multiprocessing.get_context("spawn")
    batch = synthetic_sentences(clients * 4, seed=31)
    with ProcessPoolExecutor(1, mp_context=spawn) as clients_process:
        rates = {}
        for task in ("bench", name):
            clients_process.submit(
                with_clients, bench.first.base, batch[:clients], clients, task
            ).result()  # warm up
            rates[task] = (
                len(batch)
                / clients_process.submit(with_clients, bench.first.base, batch, clients, task).result()
            )
    print(
        f"reader {reader}: {clients} clients {rates[name]:.1f} texts/s vs {rates['bench']:.1f} without"
        f" -> {rates['bench'] / rates[name]:.2f}x the time per text"
    )


def measure_freshness(bench: _Bench, base: str, group: int = 0) -> None:
    """From sending a POST of one example to its acknowledgement, after which the next classify on the
    replica sees it, vs one bare forward of that example's text + 20 ms. `group` keeps each group of
    measurements' examples apart (ids and texts)."""
    fresh, budgets = [], []
    lean = connect(base)  # one connection: the POST and the classify reach the same worker
    for i in range(5):
        new_id = 10_000 + 100 * group + i
        new_text = (
            f"fresh example {i} {bench.text}" if group == 0 else f"fresh example {i}.{group} {bench.text}"
        )
        bare_new = bench.bare_forward(bench.classifier.encoder.encode([new_text]))
        budgets.append(median_seconds(bare_new, repeats=5, device=bench.classifier.backbone.device) + 0.020)
        sent = time.perf_counter()
        post(
            lean,
            "/v1/tasks/bench/examples",
            {"examples": [{"text": new_text, "label": "1", "id": new_id}]},
        )
        fresh.append(time.perf_counter() - sent)
        seen = post(lean, "/v1/tasks/bench/classify", {"texts": [new_text], "neighbours": True})
        assert seen["predictions"][0]["neighbours"][0]["id"] == new_id, "a posted example was not visible"
    lean.close()
    post_s, budget_s = statistics.median(fresh), statistics.median(budgets)
    print(
        f"freshness: POST to acknowledged-and-in-store {post_s * 1e3:.1f} ms (median of 5), then"
        f" visible; budget one forward of the posted text + 20 ms = {budget_s * 1e3:.1f} ms"
        f" -> {post_s / budget_s:.2f}x"
    )


def measure_hot_swap(bench: _Bench, second: Served, max_length: int) -> None:
    """Failed requests on two replicas while a trained checkpoint is swapped in, and the time from
    publishing to the first response served by the new version."""
    httpx.post(
        f"{second.base}/v1/tasks/bench/classify", json={"texts": ["warm up"]}, timeout=600
    ).raise_for_status()
    failures, versions, stop = [], [], threading.Event()

    def hammer(base: str) -> Callable[[], None]:
        def run() -> None:
            with httpx.Client(base_url=base, timeout=600) as client:
                while not stop.is_set():
                    response = client.post("/v1/tasks/bench/classify", json={"texts": [bench.text]})
                    if response.status_code != 200:
                        failures.append(response.status_code)
                    else:
                        versions.append((time.perf_counter(), response.json()["model_version"]))

        return run

    load = [
        threading.Thread(target=hammer(base)) for base in (bench.first.base, second.base) for _ in range(4)
    ]
    for thread in load:
        thread.start()
    job = bench.api.post(
        "/v1/tasks/bench/train",
        # forced: the swap is measured whatever the gate would say of two steps against the untrained task
        json={"method": "prompt-ft", "steps": 2, "batch_size": 8, "eval_every": 2, "force": True},
    ).json()
    worker = Worker(redis.Redis.from_url(bench.bus_url), bench.tmp / "artifacts", max_length=max_length)
    worker.run_once(block_ms=1000)
    published_at = time.perf_counter()
    record = bench.api.get(f"/v1/jobs/{job['id']}").json()
    version = record["published"]["version"]
    deadline = time.monotonic() + 300
    while not any(v == version for _, v in versions) and time.monotonic() < deadline:
        time.sleep(0.05)
    served_at = min((t for t, v in versions if v == version), default=float("nan"))
    time.sleep(1.0)
    stop.set()
    for thread in load:
        thread.join()
    print(
        f"hot swap under load: {len(failures)} failed of {len(versions) + len(failures)} requests;"
        f" publish -> first response on the new version {(served_at - published_at) * 1e3:.0f} ms"
    )


def measure_replicas(bench: _Bench, second: Served) -> None:
    """Two api replicas on one Redis, after a burst of POSTs and the swap, hold the same ids and give
    the same predictions."""
    burst = [{"text": t, "label": str(i % 2)} for i, t in enumerate(synthetic_sentences(48, seed=17))]
    for start in range(0, len(burst), 8):
        bench.api.post(
            "/v1/tasks/bench/examples", json={"examples": burst[start : start + 8]}
        ).raise_for_status()
    probe = {"texts": synthetic_sentences(8, seed=19), "neighbours": True}
    # Compared once both serve the same version: a replica swaps in the hot swap's checkpoint on its own
    # schedule (seconds with a large backbone), and before that the two differ by design.
    waited, deadline = time.perf_counter(), time.monotonic() + 300
    while True:
        a = httpx.post(f"{bench.first.base}/v1/tasks/bench/classify", json=probe, timeout=600).json()
        b = httpx.post(f"{second.base}/v1/tasks/bench/classify", json=probe, timeout=600).json()
        if a["model_version"] == b["model_version"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    waited = time.perf_counter() - waited
    ids = [
        sorted(s.app.state.runtimes.loaded["bench"].classifier.store.ids().tolist())
        for s in (bench.first, second)
    ]
    same_labels = [p["label"] for p in a["predictions"]] == [p["label"] for p in b["predictions"]]
    same_neighbours = [[n["id"] for n in p["neighbours"]] for p in a["predictions"]] == [
        [n["id"] for n in p["neighbours"]] for p in b["predictions"]
    ]
    gap = max(
        abs(pa["probabilities"][k] - pb["probabilities"][k])
        for pa, pb in zip(a["predictions"], b["predictions"], strict=True)
        for k in pa["probabilities"]
    )
    agree = {
        "ids": ids[0] == ids[1],
        "versions": a["model_version"] == b["model_version"],
        "labels": same_labels,
        "neighbours": same_neighbours,
    }
    differ = [name for name, same in agree.items() if not same]
    print(
        f"replicas: {len(ids[0])} vs {len(ids[1])} examples,"
        f" same ids, versions, labels and neighbours: {not differ}"
        + (f" (differ: {', '.join(differ)})" if differ else "")
        + f"; largest probability difference {gap:.1e} (embedding batches differ in padding);"
        f" waited {waited:.1f} s for both to serve one version"
    )
