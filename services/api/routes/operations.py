"""Probes and metrics: liveness, readiness, Prometheus."""

from __future__ import annotations

import redis
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api.deps import MetricsDep, Registry, Threads, require_metrics_key
from services.api.schemas import Readiness
from services.bus.workers import trainer_status

router = APIRouter()


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(require_metrics_key)])
async def prometheus(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/livez")
async def livez() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness},
        503: {"model": Readiness, "description": "Still loading, or Redis unreachable"},
    },
)
async def readyz(registry: Registry, threads: Threads) -> JSONResponse:
    """Ready: Redis answers, every task is loaded, and every store has caught up with its log."""
    # A task that cannot be served (its stored spec no longer valid, or a log entry its store cannot
    # take) is listed under `broken` with why, and does not hold readiness back: the others are served.
    if not registry.warmed.is_set():
        return JSONResponse({"status": "not ready", "reason": "loading tasks and replaying their logs"}, 503)
    try:
        unreplayable = await threads.read(registry.catch_up_all)
        _, broken = await threads.read(registry.survey)
        training = await threads.read(trainer_status, registry.client)  # live workers, or a warning
    except redis.ConnectionError as error:
        return JSONResponse({"status": "not ready", "reason": f"Redis unreachable: {error}"}, 503)
    broken |= unreplayable
    return JSONResponse(
        {
            "status": "ready",
            "tasks": len(registry.runtimes) - len(unreplayable),
            "broken": broken,
            **training,
        }
    )
