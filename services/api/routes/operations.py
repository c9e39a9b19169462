"""Probes and metrics: liveness, readiness, Prometheus."""

from __future__ import annotations

import os

import redis
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from services.api.deps import ApiWorkers, MetricsDep, RedisDep, RuntimesDep, Threads, require_metrics_key
from services.api.schemas import Readiness
from services.bus.workers import trainer_status
from services.engine.runtimes import Runtimes
from services.engine.threads import ReadWriteThreads

router = APIRouter()


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(require_metrics_key)])
async def prometheus(metrics: MetricsDep) -> Response:
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/livez")
async def livez() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness},
        503: {"model": Readiness, "description": "Loading, Redis unreachable, or an api worker not ready"},
    },
)
async def readyz(
    runtimes: RuntimesDep, client: RedisDep, threads: Threads, worker_set: ApiWorkers
) -> JSONResponse:
    """Ready: Redis answers, every task is loaded, every store has caught up with its log, and so has
    every api worker behind this port (`api_workers`, each with its pid)."""
    body = await _own_readiness(runtimes, client, threads)
    ready = body["status"] == "ready"
    # A worker's own check is the full one above; the others' is what they announced (loaded and
    # replayed), each catching up with the log again at its next batch.
    workers = worker_set.members(ready) if worker_set is not None else [{"pid": os.getpid(), "ready": ready}]
    body["api_workers"] = workers
    count, expected = (
        sum(worker["ready"] for worker in workers),
        worker_set.size if worker_set is not None else 1,
    )
    if ready and count < expected:
        body |= {"status": "not ready", "reason": f"{count} of {expected} api workers ready"}
    return JSONResponse(body, 200 if body["status"] == "ready" else 503)


async def _own_readiness(runtimes: Runtimes, client: redis.Redis, threads: ReadWriteThreads) -> dict:
    # A task that cannot be served (its stored spec no longer valid, or a log entry its store cannot
    # take) is listed under `broken` with why, and does not hold readiness back: the others are served.
    if not runtimes.warmed.is_set():
        return {"status": "not ready", "reason": "loading tasks and replaying their logs"}
    try:
        unreplayable = await threads.read(runtimes.catch_up_all)
        _, broken = await threads.read(runtimes.survey)
        training = await threads.read(trainer_status, client)  # live workers, or a warning
    except redis.ConnectionError as error:
        return {"status": "not ready", "reason": f"Redis unreachable: {error}"}
    broken |= unreplayable
    tasks = len(runtimes.loaded) - len(unreplayable)
    return {"status": "ready", "tasks": tasks, "broken": broken, **training}
