"""`openbook worker`: the trainer, taking jobs off the bus until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading

from services.cli import fit_threads


def run(args: argparse.Namespace) -> int:
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
        heartbeat_ttl_s=settings.heartbeat_ttl_s,
        keep_versions=settings.keep_versions,
        untrained_gate=settings.untrained_gate,
    )
    print(f"openbook worker {settings.worker_name}: waiting for jobs on {settings.redis_url}", flush=True)
    worker.run_forever(stop)
    return 0
