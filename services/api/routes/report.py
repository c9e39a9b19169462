"""A task's quality report: how good it is, where it errs, which examples to fix (services/api/report.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse

from services.api import schemas
from services.api.deps import Reader, ReportsDep, Runtime, SettingsDep, Threads
from services.api.errors import declare
from services.api.report import NoReport
from services.bus.versions import VERSION_PATTERN

router = APIRouter(prefix="/v1/tasks/{task}")

# How long `wait=false` waits before answering 202: a report already scored, or a version's (read from its
# checkpoint), comes back in the same request.
PATIENCE_S = 1.0
RETRY_AFTER_S = 1

PENDING = {
    "model": schemas.ReportPending,
    "description": "wait=false and the report is still being computed: its progress; ask again",
    "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
}


@router.get(
    "/report",
    dependencies=[Reader],
    response_model=schemas.ReportOut,
    responses={202: PENDING, **declare(401, 403, 404, 409, 503)},
)
async def report(
    runtime: Runtime,
    settings: SettingsDep,
    threads: Threads,
    reports: ReportsDep,
    version: Annotated[
        str | None,
        Query(pattern=f"^{VERSION_PATTERN}$", description="a recorded version; default: the one served"),
    ] = None,
    wait: Annotated[
        bool,
        Query(
            description="false: answer 202 with the progress while the report is computed (an untrained "
            "task's leave-one-out pass over its examples), and ask again until it is 200"
        ),
    ] = True,
) -> schemas.ReportOut | JSONResponse:
    """The served version's report, or a recorded version's: an untrained task is scored leave-one-out
    over its labelled examples, a trained version on the dev split held out when it was made."""
    try:
        answer = await reports.report(
            runtime, settings.artifacts, version, threads, patience=None if wait else PATIENCE_S
        )
    except NoReport as error:
        raise HTTPException(error.status, str(error)) from None
    if isinstance(answer, schemas.ReportOut):
        return answer
    pending = answer.pending(runtime.task.name)
    return JSONResponse(pending.model_dump(), status_code=202, headers={"Retry-After": str(RETRY_AFTER_S)})
