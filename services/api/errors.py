"""Errors: one shape each, declared in the OpenAPI on every route that can answer them.

A 422 is always FastAPI's validation-error shape, `{"detail": [{"loc", "msg", "type"}]}`, whether
pydantic found the problem or the app did (a label the task lacks, a pair sent to a single-text task):
the app raises `unprocessable(loc, msg)`. Every other error is `{"detail": "<message>"}` (`Error`).
A 405 names every method its path allows in `Allow`, and a 503 says when to retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from services.bus.examples_log import LogError
from services.engine.runtime import StaleRuntime
from services.engine.specs import BrokenTask


class Error(BaseModel):
    detail: str


_MEANING = {
    400: "The body could not be read (e.g. it is not UTF-8)",
    401: "This route needs a key and none was given (X-API-Key or Authorization: Bearer)",
    403: "The key given does not grant this route",
    404: "No such task, example or job",
    409: "The request conflicts with what is stored (an example id or task name taken with other "
    "content), or the task's stored spec is no longer valid",
    413: "The body is over the size limit",
    503: "Redis is unreachable; retry after Retry-After seconds",
}


def declare(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each error status it can answer, with the `Error` schema.

    422 is declared by FastAPI itself on every route that takes parameters or a body.
    """
    declared: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        declared[status] = {"model": Error, "description": _MEANING[status]}
        if status == 503:
            declared[status]["headers"] = {
                "Retry-After": {"description": "seconds", "schema": {"type": "integer"}}
            }
        if status == 401:
            declared[status]["headers"] = {
                "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}
            }
    return declared


def unprocessable(loc: Sequence[str | int], message: str) -> RequestValidationError:
    """A 422 the app finds itself, in the same shape as pydantic's (raise it)."""
    return RequestValidationError([{"loc": tuple(loc), "msg": message, "type": "value_error"}])


def _printable(text: str) -> str:
    # A lone surrogate (JSON allows the escape, UTF-8 does not) would make the error itself unsendable.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_safe(value: object) -> str | int:
    return value if isinstance(value, int) else _printable(str(value))


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    # loc, msg and type only: the offending input is left out, because it can be large, a secret, or
    # not representable in JSON at all (NaN, Infinity, a lone surrogate: Python's json reads them).
    detail = [
        {
            "loc": [_json_safe(part) for part in e.get("loc", ())],
            "msg": _printable(str(e.get("msg", ""))),
            "type": str(e.get("type", "value_error")),
        }
        for e in error.errors()
    ]
    return JSONResponse({"detail": detail}, 422)


def _allowed_methods(request: Request) -> str | None:
    """Every method of every route whose path matches (`app.state.routes`: the routers' routes)."""
    methods: set[str] = set()
    for route in request.app.state.routes:
        if route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods)) or None


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    detail = _printable(str(error.detail))
    if error.status_code == 405:  # Starlette names only the first route that matched the path
        headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
    return JSONResponse({"detail": detail}, error.status_code, headers=headers)


async def _bus_unreachable(request: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"the bus is unreachable: {error}"}, 503, headers={"Retry-After": "1"})


async def _not_durable(request: Request, error: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": f"the bus did not take the write: {error}"}, 503, headers={"Retry-After": "1"}
    )


async def _stale_task(request: Request, error: Exception) -> JSONResponse:
    # The task changed again and again while one request was served (classify looks it up anew each time).
    assert isinstance(error, StaleRuntime)
    return JSONResponse({"detail": str(error)}, 409)


async def _broken_task(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, BrokenTask)
    return JSONResponse({"detail": _printable(str(error))}, 409)


def install_error_handlers(app: FastAPI) -> None:
    # Starlette types every handler as taking any Exception; one installed for a kind gets only that
    # kind, which the handlers that read its fields assert.
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(redis.ConnectionError, _bus_unreachable)
    app.add_exception_handler(redis.TimeoutError, _bus_unreachable)
    app.add_exception_handler(LogError, _not_durable)
    app.add_exception_handler(BrokenTask, _broken_task)
    app.add_exception_handler(StaleRuntime, _stale_task)
