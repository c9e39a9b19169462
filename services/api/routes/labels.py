"""A task's labels: add some to a live task, remove one that nothing depends on (see labels.py)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from openbook.label_names import LabelNameError

from services.api import schemas
from services.api.deps import RuntimesDep, Threads, Writer
from services.api.errors import declare, unprocessable
from services.engine.labels import (
    BadWord,
    LabelConflict,
    NoSuchLabel,
    NoSuchTask,
    SpecBusy,
    TooManyLabels,
    add_task_labels,
    remove_task_label,
)

router = APIRouter(prefix="/v1/tasks/{task}/labels")


@router.post("", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def add_labels(
    task: str, body: schemas.LabelIn, runtimes: RuntimesDep, threads: Threads
) -> schemas.Task:
    """Add one label (its word: given, or its name made readable) or several (`labels`: names, or
    label -> word), all or none. They are served at once, scored by their words until the next training."""
    field = "label" if body.label is not None else "labels"
    try:
        labels = body.added()
    except LabelNameError as error:
        raise unprocessable(("body", field), str(error)) from None
    try:
        return await threads.write(add_task_labels, runtimes, task, labels)
    except NoSuchTask:
        raise HTTPException(404, f"no task {task!r}") from None
    except (LabelConflict, SpecBusy) as error:
        raise HTTPException(409, str(error)) from None
    except TooManyLabels as error:
        raise unprocessable(("body", field), str(error)) from None
    except BadWord as error:
        raise unprocessable(("body", "word" if body.word is not None else field), str(error)) from None


@router.delete("/{label:path}", dependencies=[Writer], responses=declare(401, 403, 404, 409, 503))
async def remove_label(task: str, label: str, runtimes: RuntimesDep, threads: Threads) -> schemas.Task:
    try:
        return await threads.write(remove_task_label, runtimes, task, label)
    except NoSuchTask:
        raise HTTPException(404, f"no task {task!r}") from None
    except NoSuchLabel as error:
        raise HTTPException(404, str(error)) from None
    except (LabelConflict, SpecBusy) as error:
        raise HTTPException(409, str(error)) from None
