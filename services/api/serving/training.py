"""The automatic trigger's api side: queue a task's job when its settings say it is due."""

from __future__ import annotations

from services.api.metrics import Metrics
from services.api.tasks import TaskRegistry
from services.api.threads import ReadWriteThreads
from services.bus.autotrain import queue_if_due


async def train_if_due(
    task: str, registry: TaskRegistry, threads: ReadWriteThreads, metrics: Metrics
) -> None:
    """Queue the task's automatic job if its settings say it is due (services.bus.autotrain)."""
    if await threads.write(queue_if_due, registry.client, task) is not None:
        metrics.jobs.labels(task).inc()
