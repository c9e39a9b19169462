"""Training jobs: queue one for a task, follow it, list a task's (automatic ones: serving/training.py)."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from services.api import schemas
from services.api.deps import MetricsDep, Reader, RedisDep, Runtime, Threads, Writer
from services.api.errors import declare, unprocessable
from services.bus.jobs import JobQueue, TaskGone
from services.engine.task_spec import BadTraining, check_training

router = APIRouter()


@router.post(
    "/v1/tasks/{task}/train",
    status_code=202,
    dependencies=[Writer],
    responses=declare(400, 401, 403, 404, 409, 413, 503),
)
async def start_training(
    body: schemas.TrainIn, runtime: Runtime, client: RedisDep, threads: Threads, metrics: MetricsDep
) -> schemas.JobOut:
    """Queue a job; what the body leaves out, it takes from the task's `training` settings (the method
    and knobs its automatic jobs train with), so a job started by hand trains as the task does unless
    told otherwise. A `steps` or `epochs` given replaces the task's budget, its cap and floor included."""
    try:
        options = runtime.task.training.merged(body.model_dump(exclude_unset=True, exclude={"force"}))
    except ValueError as error:  # a cap or floor given that the task's budget cannot take
        raise unprocessable(("body",), str(error)) from None
    try:
        method = check_training(options, runtime.task.method, runtime.classifier.backbone)
    except BadTraining as error:
        raise unprocessable(("body", error.field) if error.field else ("body",), str(error)) from None
    queue = JobQueue(client)
    try:
        job_id = await threads.write(
            functools.partial(
                queue.submit, runtime.task.name, method, options.train_config(), force=body.force
            )
        )
    except TaskGone:  # deleted since this request found it
        raise HTTPException(404, f"no task {runtime.task.name!r}") from None
    metrics.jobs.labels(runtime.task.name).inc()
    return schemas.JobOut.model_validate(await threads.write(queue.get, job_id))


@router.get("/v1/jobs/{job_id}", dependencies=[Reader], responses=declare(401, 403, 404, 503))
async def get_job(job_id: str, client: RedisDep, threads: Threads) -> schemas.JobOut:
    record = await threads.read(JobQueue(client).get, job_id)
    if record is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return schemas.JobOut.model_validate(record)


@router.get("/v1/tasks/{task}/jobs", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def list_jobs(
    runtime: Runtime, client: RedisDep, threads: Threads, limit: Annotated[int, Query(ge=1, le=200)] = 20
) -> list[schemas.JobOut]:
    """The task's jobs, newest first: manual and automatic (`trigger`) alike."""
    records = await threads.read(JobQueue(client).of_task, runtime.task.name, limit)
    return [schemas.JobOut.model_validate(record) for record in records]
