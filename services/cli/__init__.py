"""`openbook up | serve | worker`, the service commands; every other command is the library's.

`openbook up` runs the whole stack on one machine: without a Redis URL
(`OPENBOOK_REDIS_URL` or `REDIS_URL`) it first starts the embedded server
(AOF on, under `OPENBOOK_DATA_DIR/redis`), then the api and the trainer as
child processes. SIGINT or SIGTERM stops the three, children first.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

SERVICE_COMMANDS = ("up", "serve", "worker")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "api"]:
        return run_bench_api(argv[2:])
    if not argv or argv[0] not in SERVICE_COMMANDS:
        from openbook.cli import main as library_main

        if argv and argv[0] in ("-h", "--help"):
            print("service commands: openbook up [--demo] | serve | worker | bench api\n")
        return library_main(argv)
    parser = argparse.ArgumentParser(prog=f"openbook {argv[0]}")
    parser.add_argument("--demo", action="store_true", help="up: create a demo task seeded with examples")
    args = parser.parse_args(argv[1:])
    return {"up": run_up, "serve": run_serve, "worker": run_worker}[argv[0]](args)


def fit_threads(threads: int | None) -> None:
    """torch and FAISS each use one thread per core (or `OPENBOOK_THREADS`), not more."""
    import faiss
    import torch

    count = threads or os.cpu_count() or 1
    torch.set_num_threads(count)
    faiss.omp_set_num_threads(count)


def run_bench_api(argv: list[str]) -> int:
    from openbook.models import DEFAULT_BACKBONE

    from services.bench import run_api_bench

    parser = argparse.ArgumentParser(prog="openbook bench api", description="service overheads as ratios")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--requests", type=int, default=20, help="timed single requests (median reported)")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    run_api_bench(args.backbone, max_length=args.max_length, requests=args.requests, clients=args.clients)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.api.app import create_app
    from services.api.settings import Settings

    settings = Settings()
    fit_threads(settings.threads)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    return 0


def run_worker(args: argparse.Namespace) -> int:
    import redis

    from services.api.settings import Settings
    from services.trainer.worker import Worker

    settings = Settings()
    fit_threads(settings.threads)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    worker = Worker(
        redis.Redis.from_url(settings.redis_url, socket_timeout=30),
        settings.artifacts,
        consumer=settings.worker_name,
        device=settings.device,
        max_length=settings.max_length,
    )
    print(f"openbook worker {settings.worker_name}: waiting for jobs on {settings.redis_url}", flush=True)
    worker.run_forever(stop)
    return 0


def run_up(args: argparse.Namespace) -> int:
    from services.api.settings import Settings
    from services.bus.server import EmbeddedRedis

    settings = Settings()
    env = dict(os.environ)
    embedded = None
    if not (os.environ.get("OPENBOOK_REDIS_URL") or os.environ.get("REDIS_URL")):
        embedded = EmbeddedRedis(settings.data_dir / "redis").start()
        env["OPENBOOK_REDIS_URL"] = embedded.url
        print(
            f"openbook up: embedded Redis (AOF always) on {embedded.url}, data in {settings.data_dir}",
            flush=True,
        )
    children = [
        subprocess.Popen([sys.executable, "-m", "services.cli", name], env=env)
        for name in ("serve", "worker")
    ]
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    base = f"http://{settings.host}:{settings.port}"
    try:
        if args.demo:
            _seed_demo(base, stopping)
        while not stopping.is_set() and all(child.poll() is None for child in children):
            stopping.wait(0.5)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if embedded is not None:
            embedded.stop()
    failed = [child.returncode for child in children if child.returncode not in (0, -signal.SIGTERM)]
    return 1 if failed else 0


def _seed_demo(base: str, stopping: threading.Event) -> None:
    """Once the api is ready, create the `sentiment` task with the examples in examples/sentiment.tsv."""
    from openbook.data import read_split

    from services.api.schemas import ExampleIn
    from services.client import OpenBookClient, wait_ready

    if not wait_ready(base, timeout=600, alive=lambda: not stopping.is_set()):
        return
    with OpenBookClient(base, api_key=os.environ.get("OPENBOOK_API_KEY"), timeout=300) as client:
        client.create_task(
            "sentiment", "Review: {text}\nSentiment: {mask}", {"0": "negative", "1": "positive"}
        )
        examples = [
            ExampleIn(text=e.text, label=e.label, id=i)
            for i, e in enumerate(read_split("examples/sentiment.tsv"))
        ]
        client.add_examples("sentiment", examples)
    print(f"openbook up: demo task 'sentiment' ready with {len(examples)} examples at {base}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
