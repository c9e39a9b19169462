"""A task's labels: add one to a live task, remove one that nothing depends on (see labels.py)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from services.api import schemas
from services.api.deps import Registry, Threads, Writer
from services.api.errors import declare, unprocessable
from services.api.labels import (
    BadWord,
    LabelConflict,
    NoSuchLabel,
    NoSuchTask,
    SpecBusy,
    add_task_label,
    remove_task_label,
)

router = APIRouter(prefix="/v1/tasks/{task}/labels")


@router.post("", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def add_label(task: str, body: schemas.LabelIn, registry: Registry, threads: Threads) -> schemas.Task:
    try:
        return await threads.write(add_task_label, registry, task, body.label, body.word)
    except NoSuchTask:
        raise HTTPException(404, f"no task {task!r}") from None
    except (LabelConflict, SpecBusy) as error:
        raise HTTPException(409, str(error)) from None
    except BadWord as error:
        raise unprocessable(("body", "word"), str(error)) from None


@router.delete("/{label:path}", dependencies=[Writer], responses=declare(401, 403, 404, 409, 503))
async def remove_label(task: str, label: str, registry: Registry, threads: Threads) -> schemas.Task:
    try:
        return await threads.write(remove_task_label, registry, task, label)
    except NoSuchTask:
        raise HTTPException(404, f"no task {task!r}") from None
    except NoSuchLabel as error:
        raise HTTPException(404, str(error)) from None
    except (LabelConflict, SpecBusy) as error:
        raise HTTPException(409, str(error)) from None
