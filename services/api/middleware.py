"""Pure ASGI middleware: the body size limit, request latency by route and status, the answering worker."""

from __future__ import annotations

import os
import time

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.metrics import Metrics


class MeasureLatency:
    """Latency by method, route and status; an exception that escapes counts as the 500 it becomes."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts: an exception that escapes is answered 500 outside

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.latency.labels(scope["method"], path, str(status)).observe(
                time.perf_counter() - started
            )


class NameWorker:
    """`X-OpenBook-Worker: <pid>` on every answer, when the api runs as several workers behind one port:
    which process answered, to match a response with `/readyz`'s `api_workers` and the worker's log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (b"x-openbook-worker", str(os.getpid()).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, send_named)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is over the limit of {limit} bytes")


class LimitBody:
    """Refuse a body over `max_bytes` with a 413, counting the bytes as they arrive.

    A Content-Length over the limit is refused before anything is read; a chunked body (no length
    given) is read only up to the limit: the receive channel raises BodyTooLarge when it is passed,
    wherever the body is being read (in a route it becomes the 413 through the error handlers).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)  # and nothing more is read
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive_within_limit, send_and_note)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = BodyTooLarge(self.max_bytes)
        await JSONResponse({"detail": error.detail}, error.status_code)(scope, receive, send)
