"""Predictions, and the neural demonstrations behind them."""

from __future__ import annotations

import contextlib

import redis
from fastapi import APIRouter
from fastapi.responses import Response

from services.api import schemas
from services.api.checks import check_batch, check_text
from services.api.deps import Reader, Runtime, Serving, SettingsDep, Threads
from services.api.errors import declare
from services.api.serving.predictions import demonstration_classes, prediction_out
from services.engine.runtime import StaleRuntime

router = APIRouter(prefix="/v1/tasks/{task}")


# Lookups after a StaleRuntime before giving up: each follows a change to the task made during the request.
STALE_RETRIES = 2


@router.post(
    "/classify", response_model=schemas.ClassifyOut, responses=declare(400, 401, 403, 404, 409, 413, 503)
)
async def classify(body: schemas.ClassifyIn, served: Serving) -> Response:
    # One dependency, not five, and the runtime from the replica's cache: this is the hot path (deps.py).
    runtime, settings = served.runtime, served.settings
    check_batch(len(body.texts), ("body", "texts"), settings)
    served.metrics.batch_size.observe(len(body.texts))
    for retry in range(STALE_RETRIES + 1):
        for i, text in enumerate(body.texts):
            check_text(text, ("body", "texts", i), runtime, settings)
        try:
            # The batch checks the task is unchanged, then catches up with the log (TaskRuntime.predict).
            result = await served.batchers.batcher_for(runtime).predict(body.texts, runtime)
            break
        except StaleRuntime:
            if retry == STALE_RETRIES:
                raise
            runtime = await served.look_up_again()
    predictions, model_version, store_version = result
    threshold = (
        body.min_confidence if "min_confidence" in body.model_fields_set else runtime.task.min_confidence
    )
    # Built from the service's own values without validating them again, and written by pydantic's
    # serializer: validating and encoding the answer through FastAPI cost about 45 us a prediction, the
    # largest per-text cost of a gathered request after the forward (docs/benchmarks.md).
    answer = schemas.ClassifyOut.model_construct(
        predictions=[prediction_out(p, runtime, body.neighbours, threshold) for p in predictions],
        model_version=model_version,
        store_version=store_version,
        min_confidence=threshold,
        reader=runtime.task.reader,
    )
    return Response(answer.model_dump_json(), media_type="application/json")


@router.post("/demonstrations", dependencies=[Reader], responses=declare(400, 401, 403, 404, 409, 413, 503))
async def demonstrations(
    body: schemas.DemonstrationsIn, runtime: Runtime, settings: SettingsDep, threads: Threads
) -> schemas.DemonstrationsOut:
    check_text(body.text, ("body", "text"), runtime, settings)
    with contextlib.suppress(redis.ConnectionError):  # Redis away: what the store holds so far
        await threads.read(runtime.catch_up)
    demos = await threads.read(runtime.demonstrations, body.text)
    return schemas.DemonstrationsOut(
        demonstrations=demonstration_classes(demos, runtime),
        read_by_model=runtime.classifier.demo_encoder is not None,
        model_version=runtime.model_version,
        store_version=runtime.offset,
    )
