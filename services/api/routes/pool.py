"""A task's pool of unlabelled texts: add to it, page through it, and the suggestions drawn from it
(serving/unlabelled.py ranks them). Posting an example under a pool id takes that text out of the pool."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from services.api import schemas
from services.api.checks import check_batch, check_text
from services.api.deps import Reader, Runtime, SettingsDep, Threads, Writer
from services.api.errors import declare
from services.api.serving.unlabelled import suggest, unlabelled_pool
from services.bus.pool import PoolConflict, PoolText

router = APIRouter(prefix="/v1/tasks/{task}")


@router.post(
    "/pool", status_code=201, dependencies=[Writer], responses=declare(400, 401, 403, 404, 409, 413, 503)
)
async def add_to_pool(
    body: schemas.PoolIn, runtime: Runtime, settings: SettingsDep, threads: Threads
) -> schemas.PoolAck:
    check_batch(len(body.texts), ("body", "texts"), settings)
    for i, text in enumerate(body.texts):
        check_text(text.text, ("body", "texts", i, "text"), runtime, settings)
    try:
        created = await threads.write(
            unlabelled_pool(runtime).add, [PoolText(t.id, t.text) for t in body.texts]
        )
    except PoolConflict as error:
        raise HTTPException(409, str(error)) from None
    return schemas.PoolAck(
        texts=[schemas.PoolTextAck(id=t.id, created=c) for t, c in zip(body.texts, created, strict=True)]
    )


@router.get("/pool", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def list_pool(
    runtime: Runtime,
    threads: Threads,
    after: Annotated[int, Query(ge=-1)] = -1,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> schemas.PoolPage:
    texts, next_after = await threads.read(unlabelled_pool(runtime).page, after, limit)
    return schemas.PoolPage(
        texts=[schemas.PoolTextOut(id=t.id, text=t.text) for t in texts], next_after=next_after
    )


@router.get("/suggestions", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def suggestions(
    runtime: Runtime,
    settings: SettingsDep,
    threads: Threads,
    n: Annotated[int, Query(ge=1, le=100, description="how many suggestions")] = 10,
) -> schemas.SuggestionsOut:
    """The `n` pool texts the served version is least sure of, least sure first.

    Only the first SCORED_POOL_MAX (2000) pool texts by id are scored, in batches of the app's
    `batch_max_texts` through the task runtime; `scored` says how many were.
    """
    return await suggest(runtime, threads, settings.batch_max_texts, n)
