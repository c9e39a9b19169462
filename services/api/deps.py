"""Dependencies the routes declare: the app's shared state (on `app.state`), a task's runtime, the keys.

Routes take these as `Annotated` aliases (`SpecsDep`, `RuntimesDep`, `Runtime`, `Threads`, ...) and
guard themselves with `Reader` or `Writer`; who may read and who may write is told in `settings.py`.
They are all async: FastAPI would run a plain `def` in its default thread pool, a hop per dependency
for nothing.

FastAPI's own cost per request grows with the number of dependencies it resolves, and with a fast
forward it is the largest cost on the classify path (docs/benchmarks.md, "The request path,
profiled"). So classify takes one dependency, `Serving`: the read key's check, the task's runtime and
the app's state, four resolved dependencies instead of eleven. And it takes the task's runtime from the
replica's cache, without the Redis read and the hop to a worker thread that `get_runtime` costs: the
micro-batch checks once, under the runtime's lock, that the task has not changed since
(`TaskRuntime.predict`), and classify looks the task up again when it has (`routes/classify.py`).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

import redis
from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from services.api.api_workers import ApiWorkerSet
from services.api.metrics import Metrics
from services.api.serving.reports import Reports
from services.api.settings import Settings
from services.engine.batching import Batchers
from services.engine.runtime import TaskRuntime
from services.engine.runtimes import Runtimes
from services.engine.specs import TaskSpecs
from services.engine.threads import ReadWriteThreads


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_runtimes(request: Request) -> Runtimes:
    return request.app.state.runtimes


async def get_specs(request: Request) -> TaskSpecs:
    return request.app.state.runtimes.specs


async def get_redis(request: Request) -> redis.Redis:
    return request.app.state.redis


async def get_threads(request: Request) -> ReadWriteThreads:
    return request.app.state.threads


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_batchers(request: Request) -> Batchers:
    return request.app.state.batchers


async def get_reports(request: Request) -> Reports:
    return request.app.state.reports


async def get_api_workers(request: Request) -> ApiWorkerSet | None:
    return request.app.state.api_workers


SettingsDep = Annotated[Settings, Depends(get_settings)]
RuntimesDep = Annotated[Runtimes, Depends(get_runtimes)]  # the replica's task runtimes
SpecsDep = Annotated[TaskSpecs, Depends(get_specs)]  # the task specs in Redis
RedisDep = Annotated[redis.Redis, Depends(get_redis)]  # the bus, for jobs and versions
Threads = Annotated[ReadWriteThreads, Depends(get_threads)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
BatchersDep = Annotated[Batchers, Depends(get_batchers)]
ReportsDep = Annotated[Reports, Depends(get_reports)]  # reports being computed off the request
ApiWorkers = Annotated[ApiWorkerSet | None, Depends(get_api_workers)]  # None: the api is one process

_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="the read or the write key")
_bearer = HTTPBearer(auto_error=False, description="the read or the write key")


async def _presented(
    api_key: Annotated[str | None, Security(_api_key)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> str | None:
    return api_key or (bearer.credentials if bearer else None)


Presented = Annotated[str | None, Depends(_presented)]


def _check(presented: str | None, keys: list[str], doing: str) -> None:
    """Pass when no key guards this, or when `presented` is one of `keys` (compared in constant time)."""
    if not keys:
        return
    if presented is None:
        raise HTTPException(
            401, f"{doing} needs a key (X-API-Key or Authorization: Bearer)", {"WWW-Authenticate": "Bearer"}
        )
    given = presented.encode("latin-1")  # header values arrive as latin-1: these are the bytes sent
    # Every key is compared, so the time taken does not tell which one came close.
    if not any([hmac.compare_digest(given, key.encode()) for key in keys]):
        raise HTTPException(403, f"this key does not allow {doing}")


def _read_keys(settings: Settings) -> list[str]:
    return [key for key in (settings.read_key, settings.api_key) if key]


async def require_read(settings: SettingsDep, presented: Presented) -> None:
    _check(presented, _read_keys(settings), "reading")


async def require_write(settings: SettingsDep, presented: Presented) -> None:
    _check(presented, [settings.api_key] if settings.api_key else [], "writing")


async def require_metrics_key(settings: SettingsDep, presented: Presented) -> None:
    if settings.metrics_need_key:
        _check(presented, _read_keys(settings), "reading metrics")


Reader = Depends(require_read)
Writer = Depends(require_write)


async def get_runtime(task: str, runtimes: RuntimesDep, threads: Threads) -> TaskRuntime:
    runtime = await threads.read(runtimes.runtime, task)  # BrokenTask: a 409 (errors.py)
    if runtime is None:
        raise HTTPException(404, f"no task {task!r}")
    return runtime


Runtime = Annotated[TaskRuntime, Depends(get_runtime)]


@dataclass(frozen=True)
class TaskRead:
    """What the classify path reads, resolved as one dependency (see the module's docstring)."""

    runtime: TaskRuntime  # perhaps stale: only for `TaskRuntime.predict`, which checks (module docstring)
    settings: Settings
    metrics: Metrics
    batchers: Batchers
    runtimes: Runtimes
    threads: ReadWriteThreads

    async def look_up_again(self) -> TaskRuntime:
        """The task's runtime as Redis has it now (404 when the task is gone), after a StaleRuntime."""
        return await get_runtime(self.runtime.task.name, self.runtimes, self.threads)


async def serve_read(request: Request, task: str, presented: Presented) -> TaskRead:
    """`Reader`, then the task's runtime, in that order (401/403 before 404), with the app's state."""
    state = request.app.state
    _check(presented, _read_keys(state.settings), "reading")
    runtime = state.runtimes.cached_runtime(task) or await get_runtime(task, state.runtimes, state.threads)
    return TaskRead(runtime, state.settings, state.metrics, state.batchers, state.runtimes, state.threads)


Serving = Annotated[TaskRead, Depends(serve_read)]
