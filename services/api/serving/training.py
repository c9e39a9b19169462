"""The automatic trigger's api side: queue a task's job when its settings say it is due."""

from __future__ import annotations

import redis

from services.api.metrics import Metrics
from services.engine.autotrain import queue_if_due
from services.engine.threads import ReadWriteThreads


async def train_if_due(task: str, client: redis.Redis, threads: ReadWriteThreads, metrics: Metrics) -> None:
    """Queue the task's automatic job if its settings say it is due (services.engine.autotrain)."""
    if await threads.write(queue_if_due, client, task) is not None:
        metrics.jobs.labels(task).inc()
