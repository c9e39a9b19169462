"""A task's model versions: list them, promote one (a rollback), pin one against retention."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from services.api import schemas
from services.api.deps import Reader, RedisDep, SettingsDep, SpecsDep, Threads, Writer
from services.api.errors import declare
from services.bus import versions
from services.bus.versions import UnknownVersion

router = APIRouter()


async def _known_task(task: str, specs: SpecsDep, threads: Threads) -> None:
    # The spec alone: listing versions needs no classifier built. A stored spec that no longer reads is a
    # BrokenTask, which errors.py answers with a 409.
    if await threads.read(specs.get, task) is None:
        raise HTTPException(404, f"no task {task!r}")


@router.get("/v1/tasks/{task}/versions", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def list_versions(
    task: str, specs: SpecsDep, client: RedisDep, threads: Threads
) -> schemas.VersionsOut:
    await _known_task(task, specs, threads)
    serving, records = await threads.read(versions.list_versions, client, task)
    return schemas.VersionsOut(
        serving=serving, versions=[schemas.VersionOut.model_validate(r) for r in records]
    )


@router.post(
    "/v1/tasks/{task}/versions/{version}/promote",
    dependencies=[Writer],
    responses=declare(401, 403, 404, 409, 503),
)
async def promote_version(
    task: str, version: str, specs: SpecsDep, client: RedisDep, threads: Threads, settings: SettingsDep
) -> schemas.VersionOut:
    """Serve this version on every replica (a rollback when it is older); the one serving is retired.

    A version the gate rejected may be promoted too: that is the operator's choice.
    """
    await _known_task(task, specs, threads)
    try:
        record = await threads.write(versions.promote, client, task, version)
    except UnknownVersion as error:  # never recorded, or deleted by retention
        raise HTTPException(404, str(error)) from None
    await threads.write(versions.retain, client, task, settings.artifacts, settings.keep_versions)
    return schemas.VersionOut.model_validate(record)


@router.patch(
    "/v1/tasks/{task}/versions/{version}",
    dependencies=[Writer],
    responses=declare(400, 401, 403, 404, 409, 413, 503),
)
async def pin_version(
    task: str, version: str, body: schemas.PinIn, specs: SpecsDep, client: RedisDep, threads: Threads
) -> schemas.VersionOut:
    """Pin (retention keeps it whatever its age) or unpin a version."""
    await _known_task(task, specs, threads)
    try:
        record = await threads.write(versions.set_pinned, client, task, version, body.pinned)
    except UnknownVersion as error:
        raise HTTPException(404, str(error)) from None
    return schemas.VersionOut.model_validate(record)
