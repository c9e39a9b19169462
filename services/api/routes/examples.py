"""A task's labelled examples: add (acknowledged once Redis has them on disk; with `create_labels`,
the labels they name that the task lacks too), page through, relabel, delete.

An example posted under a pool id labels that pool text, which then leaves the pool; a task that trains
by itself may queue its next job (serving/examples.py records them and does both).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from services.api import schemas
from services.api.checks import check_batch, check_label, check_text
from services.api.deps import MetricsDep, Reader, Runtime, RuntimesDep, SettingsDep, Threads, Writer
from services.api.errors import declare, unprocessable
from services.api.serving.examples import record_examples
from services.bus.examples_log import ConflictError, NewExample, UnknownLabel
from services.engine.labels import BadNewLabel, BadWord, LabelConflict, NoSuchTask, SpecBusy, TooManyLabels

router = APIRouter(prefix="/v1/tasks/{task}/examples")


@router.post("", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def add_examples(
    body: schemas.ExamplesIn,
    runtime: Runtime,
    runtimes: RuntimesDep,
    settings: SettingsDep,
    threads: Threads,
    metrics: MetricsDep,
) -> schemas.ExamplesAck:
    """Add labelled examples, all or none; with `create_labels`, the labels they name that the task
    lacks are added with them (services/engine/labels.py)."""
    check_batch(len(body.examples), ("body", "examples"), settings)
    for i, example in enumerate(body.examples):
        check_text(example.text, ("body", "examples", i, "text"), runtime, settings)
        if not body.create_labels:
            check_label(example.label, ("body", "examples", i, "label"), runtime)
    new = [NewExample(e.text, e.label, e.id) for e in body.examples]
    pool_ids = [e.id for e in body.examples if e.id is not None]

    def label_at(label: str) -> tuple[str | int, ...]:
        return ("body", "examples", next(i for i, e in enumerate(new) if e.label == label), "label")

    try:
        appended, job = await threads.write(
            record_examples, runtime, runtimes, new, pool_ids, body.create_labels
        )
    except (ConflictError, LabelConflict, SpecBusy) as error:
        raise HTTPException(409, str(error)) from None
    except NoSuchTask:
        raise HTTPException(404, f"no task {runtime.task.name!r}") from None
    except UnknownLabel as error:  # removed from the task since check_label read the labels
        raise unprocessable(("body", "examples", error.position, "label"), str(error)) from None
    except BadNewLabel as error:
        raise unprocessable(label_at(error.label), str(error)) from None
    except (TooManyLabels, BadWord) as error:
        raise unprocessable(("body", "create_labels"), str(error)) from None
    if job is not None:
        metrics.jobs.labels(runtime.task.name).inc()
    return schemas.ExamplesAck(
        examples=[schemas.ExampleAck(id=a.id, created=a.offset is not None) for a in appended],
        store_version=runtime.offset,
    )


@router.get("", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def list_examples(
    runtime: Runtime,
    threads: Threads,
    after: Annotated[int, Query(ge=-1)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> schemas.ExamplePage:
    await threads.read(runtime.catch_up)
    ids = sorted(i for i in runtime.texts if i > after)
    page = ids[:limit]
    return schemas.ExamplePage(
        examples=[schemas.Example(id=i, text=runtime.texts[i], label=runtime.labels[i]) for i in page],
        next_after=page[-1] if len(ids) > limit else None,
    )


@router.patch("/{example_id}", dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def relabel_example(
    example_id: int, body: schemas.RelabelIn, runtime: Runtime, threads: Threads
) -> schemas.Relabelled:
    """Change an example's label (e.g. a suspect of the task's report); its text stays. The store
    re-embeds it under the new label at once; training sees it at the next job."""
    check_label(body.label, ("body", "label"), runtime)
    await threads.read(runtime.catch_up)
    if example_id not in runtime.texts:
        raise HTTPException(404, f"no example {example_id} in task {runtime.task.name!r}")
    text, old_label = runtime.texts[example_id], runtime.labels[example_id]
    try:
        found = await threads.write(runtime.log.relabel, NewExample(text, body.label, example_id), old_label)
    except ConflictError as error:  # changed since this request read it
        raise HTTPException(409, str(error)) from None
    except UnknownLabel as error:  # removed from the task since check_label read the labels
        raise unprocessable(("body", "label"), str(error)) from None
    if not found:  # deleted meanwhile
        raise HTTPException(404, f"no example {example_id} in task {runtime.task.name!r}")
    await threads.write(runtime.catch_up)
    return schemas.Relabelled(
        example=schemas.Example(id=example_id, text=text, label=body.label), store_version=runtime.offset
    )


@router.delete(
    "/{example_id}", status_code=204, dependencies=[Writer], responses=declare(401, 403, 404, 409, 503)
)
async def delete_example(example_id: int, runtime: Runtime, threads: Threads) -> None:
    if not await threads.write(runtime.log.delete, example_id):
        raise HTTPException(404, f"no example {example_id} in task {runtime.task.name!r}")
    await threads.write(runtime.catch_up)
