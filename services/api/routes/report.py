"""A task's quality report: how good it is, where it errs, which examples to fix (services/api/report.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from services.api import schemas
from services.api.deps import Reader, Runtime, SettingsDep, Threads
from services.api.errors import declare
from services.api.report import NoReport, task_report
from services.bus.versions import VERSION_PATTERN

router = APIRouter(prefix="/v1/tasks/{task}")


@router.get("/report", dependencies=[Reader], responses=declare(401, 403, 404, 409, 503))
async def report(
    runtime: Runtime,
    settings: SettingsDep,
    threads: Threads,
    version: Annotated[
        str | None,
        Query(pattern=f"^{VERSION_PATTERN}$", description="a recorded version; default: the one served"),
    ] = None,
) -> schemas.ReportOut:
    """The served version's report, or a recorded version's: an untrained task is scored leave-one-out
    over its labelled examples, a trained version on the dev split held out when it was made."""
    try:
        return await threads.read(task_report, runtime, settings.artifacts, version)
    except NoReport as error:
        raise HTTPException(error.status, str(error)) from None
