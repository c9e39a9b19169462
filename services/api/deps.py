"""Dependencies shared by the routes: the settings, the task registry, a task's runtime, the API key."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from openbook.prompting import PromptError

from services.api.settings import Settings
from services.api.tasks import TaskRegistry, TaskRuntime


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_registry(request: Request) -> TaskRegistry:
    return request.app.state.registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
Registry = Annotated[TaskRegistry, Depends(get_registry)]


def require_key(
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> None:
    if settings.api_key is None:
        return
    given = x_api_key or (authorization.removeprefix("Bearer ").strip() if authorization else None)
    if given is None:
        raise HTTPException(401, "this write needs an API key (X-API-Key or Authorization: Bearer)")
    if given != settings.api_key:
        raise HTTPException(403, "wrong API key")


async def get_runtime(task: str, registry: Registry) -> TaskRuntime:
    try:
        runtime = await asyncio.to_thread(registry.runtime, task)
    except PromptError as error:
        raise HTTPException(422, str(error)) from None
    if runtime is None:
        raise HTTPException(404, f"no task {task!r}")
    return runtime


Runtime = Annotated[TaskRuntime, Depends(get_runtime)]
Writer = Depends(require_key)
