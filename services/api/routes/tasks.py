"""Tasks: create, list, read, change the training settings, delete."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response

from services.api import schemas
from services.api.deps import (
    MetricsDep,
    Reader,
    RedisDep,
    Runtime,
    RuntimesDep,
    SettingsDep,
    SpecsDep,
    Threads,
    Writer,
)
from services.api.errors import declare, unprocessable
from services.api.serving.training import train_if_due
from services.engine.autotrain import SpecChanged
from services.engine.specs import InvalidSpec, TaskExists

router = APIRouter(prefix="/v1/tasks")

BROKEN_TASKS = "OpenBook-Broken-Tasks"


@router.post("", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 409, 413, 503))
async def create_task(
    body: schemas.TaskCreate, specs: SpecsDep, settings: SettingsDep, threads: Threads
) -> schemas.Task:
    # The same spec again is a no-op; a spec is checked in full (TaskSpecs.build) before it is stored.
    task = body.as_task(settings.default_backbone, settings.default_reader)
    try:
        await threads.write(specs.create, task)
    except InvalidSpec as error:
        raise unprocessable(_located(error), str(error)) from None
    except TaskExists as error:
        raise HTTPException(409, str(error)) from None
    return task


@router.get(
    "",
    dependencies=[Reader],
    responses={
        200: {
            "headers": {
                BROKEN_TASKS: {
                    "description": "stored tasks not served (their spec no longer valid), comma-separated",
                    "schema": {"type": "string"},
                }
            }
        },
        **declare(401, 403, 503),
    },
)
async def list_tasks(runtimes: RuntimesDep, threads: Threads, response: Response) -> list[schemas.Task]:
    tasks, broken = await threads.read(runtimes.survey)
    if broken:  # names as stored: keep the header ASCII whatever they hold
        response.headers[BROKEN_TASKS] = ", ".join(
            n.encode("ascii", "backslashreplace").decode() for n in broken
        )
    return tasks


@router.get("/{task}", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def get_task(runtime: Runtime) -> schemas.Task:
    return runtime.task


@router.patch("/{task}", dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def update_task(
    body: schemas.TaskPatch,
    runtime: Runtime,
    specs: SpecsDep,
    client: RedisDep,
    threads: Threads,
    metrics: MetricsDep,
) -> schemas.Task:
    """Change the task's training settings (the keys given replace the stored ones, the others stay)
    and its `min_confidence`.

    What the task serves (its model version and store) is untouched; when and how it trains change, and
    below which confidence its predictions abstain.
    """
    name = runtime.task.name
    changes = {} if body.training is None else body.training.model_dump(exclude_unset=True)
    serving = body.model_dump(include={"min_confidence"}, exclude_unset=True)
    try:
        task = await threads.write(specs.update_training, name, changes, serving)
    except InvalidSpec as error:
        raise unprocessable(_located(error), str(error)) from None
    except SpecChanged as error:
        raise HTTPException(409, str(error)) from None
    if task is None:  # deleted since this request found it
        raise HTTPException(404, f"no task {name!r}")
    await train_if_due(name, client, threads, metrics)  # turned on with enough examples waiting
    return task


def _located(error: InvalidSpec) -> tuple[str, ...]:
    return ("body", *error.field.split(".")) if error.field else ("body",)


@router.delete("/{task}", status_code=204, dependencies=[Writer], responses=declare(401, 403, 404, 503))
async def delete_task(task: str, runtimes: RuntimesDep, threads: Threads, settings: SettingsDep) -> None:
    # Needs no runtime, so a task whose stored spec broke can be deleted too. Everything the task owned
    # goes: its log, checkpoints, pointer, jobs and artifacts.
    if not await threads.write(runtimes.delete, task, settings.artifacts):
        raise HTTPException(404, f"no task {task!r}")
