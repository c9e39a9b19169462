"""Training jobs: queue one for a task, follow it."""

from __future__ import annotations

import functools

from fastapi import APIRouter, HTTPException
from openbook.methods import build_method
from openbook.training import TrainConfig

from services.api import schemas
from services.api.deps import MetricsDep, Reader, Registry, Runtime, Threads, Writer
from services.api.errors import declare, unprocessable
from services.bus.jobs import JobQueue, TaskGone

router = APIRouter()


@router.post(
    "/v1/tasks/{task}/train",
    status_code=202,
    dependencies=[Writer],
    responses=declare(400, 401, 403, 404, 409, 413, 503),
)
async def start_training(
    body: schemas.TrainIn, runtime: Runtime, registry: Registry, threads: Threads, metrics: MetricsDep
) -> schemas.JobOut:
    method = body.method or runtime.task.method
    config = body.model_dump(exclude={"method", "force"})
    try:
        build_method(method).check_backbone(runtime.classifier.backbone)
    except ValueError as error:
        raise unprocessable(("body", "method"), str(error)) from None
    try:
        TrainConfig(**config)
    except ValueError as error:
        raise unprocessable(("body",), str(error)) from None
    queue = JobQueue(registry.client)
    try:
        job_id = await threads.write(
            functools.partial(queue.submit, runtime.task.name, method, config, force=body.force)
        )
    except TaskGone:  # deleted since this request found it
        raise HTTPException(404, f"no task {runtime.task.name!r}") from None
    metrics.jobs.labels(runtime.task.name).inc()
    return schemas.JobOut.model_validate(await threads.write(queue.get, job_id))


@router.get("/v1/jobs/{job_id}", dependencies=[Reader], responses=declare(401, 403, 404, 503))
async def get_job(job_id: str, registry: Registry, threads: Threads) -> schemas.JobOut:
    record = await threads.read(JobQueue(registry.client).get, job_id)
    if record is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return schemas.JobOut.model_validate(record)
