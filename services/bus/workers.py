"""Trainer workers as the bus sees them: one heartbeat key each, with a time to live.

A worker sets `openbook:worker:<name>` (its pid and the job it runs) every
third of its time to live, so the key outlives a dead worker by at most that
time, and not at all when whoever saw it die says so (`worker_died`, which
also queues its jobs again at once). `/readyz` reports `trainer_status`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, cast

import redis

from services.bus.jobs import JobQueue

WORKERS_KEY = "openbook:workers"  # set: the names that have sent a heartbeat, alive or not


def heartbeat_key(name: str) -> str:
    return f"openbook:worker:{name}"


def beat(client: redis.Redis, name: str, *, ttl_s: float, job: str | None) -> None:
    info = json.dumps({"name": name, "pid": os.getpid(), "job": job, "at": time.time()})
    with client.pipeline(transaction=True) as pipe:
        pipe.set(heartbeat_key(name), info, px=max(1, int(ttl_s * 1000)))
        pipe.sadd(WORKERS_KEY, name)
        pipe.execute()


def forget(client: redis.Redis, name: str) -> None:
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(heartbeat_key(name))
        pipe.srem(WORKERS_KEY, name)
        pipe.execute()


def live_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """The workers whose heartbeat has not expired, by name: name, pid, the job each runs."""
    names = sorted(name.decode() for name in cast(set[bytes], client.smembers(WORKERS_KEY)))
    if not names:
        return []
    beats = client.mget([heartbeat_key(name) for name in names])
    if gone := [name for name, info in zip(names, beats, strict=True) if info is None]:
        client.srem(WORKERS_KEY, *gone)
    return [json.loads(info) for info in beats if info is not None]


def trainer_status(client: redis.Redis) -> dict[str, Any]:
    """What `/readyz` says about training: the live workers, and a warning when there is none."""
    names = [worker["name"] for worker in live_workers(client)]
    if not names:
        return {"workers": [], "warning": "no trainer worker is alive: training jobs wait in the queue"}
    return {"workers": names}


def worker_died(client: redis.Redis, name: str, reason: str) -> list[str]:
    """A worker is known dead: it is no longer reported alive, and the jobs it held are queued again."""
    forget(client, name)
    return JobQueue(client).release(name, reason)
