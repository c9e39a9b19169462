"""Limits that keep one kind of request from starving the others: body size, thread pools."""

from __future__ import annotations

import json
import threading
import time

import pytest

from services.bus.examples_log import ExampleLog
from tests.services.harness import TASK


def test_a_chunked_body_is_cut_at_the_limit(make_client) -> None:
    # No Content-Length: the app must stop reading at the limit, not read it all and then refuse it.
    chunk, limit = 64 * 1024, 100_000
    with make_client(max_body_bytes=limit) as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        pulled = 0

        async def receive() -> dict:  # 20 MB of one JSON string, sent 64 KiB at a time
            nonlocal pulled
            pulled += chunk
            body = b'{"texts": ["' + b"a" * (chunk - 12) if pulled == chunk else b"a" * chunk
            return {"type": "http.request", "body": body, "more_body": pulled < 20_000_000}

        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/tasks/reviews/classify", "raw_path": b"/v1/tasks/reviews/classify",
            "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
            "headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
        }  # fmt: skip
        api.portal.call(api.app, scope, receive, send)
        assert sent[0]["status"] == 413
        assert pulled <= limit + chunk
        body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
        assert "over the limit of 100000" in body["detail"]


def test_a_chunked_body_over_the_limit_gets_a_413_over_http(make_client) -> None:
    import httpx

    from tests.services.harness import serving

    def chunks():  # 300 kB without a Content-Length: httpx sends it chunked
        yield b'{"texts": ["'
        for _ in range(300):
            yield b"a" * 1000

    with serving(make_client(max_body_bytes=100_000).app) as base:
        response = httpx.post(
            f"{base}/v1/tasks", content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 413 and "over the limit of 100000" in response.json()["detail"]


def test_blocked_writes_never_stall_reads(make_client, monkeypatch: pytest.MonkeyPatch) -> None:
    # Writes that wait on a slow log (here: one that blocks until released) take every thread they are
    # allowed; reads have threads of their own and still answer at once.
    release = threading.Event()
    original = ExampleLog.append

    def slow_append(self, examples):
        release.wait(60)
        return original(self, examples)

    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        monkeypatch.setattr(ExampleLog, "append", slow_append)
        statuses: list[int] = []

        def write(i: int) -> None:
            body = {"examples": [{"text": f"text {i}", "label": "1"}]}
            statuses.append(api.post("/v1/tasks/reviews/examples", json=body).status_code)

        writers = [threading.Thread(target=write, args=(i,)) for i in range(40)]  # more than any pool
        timings: dict[str, float] = {}

        def read(path: str) -> None:
            started = time.perf_counter()
            api.get(path)
            timings[path] = time.perf_counter() - started

        try:
            for writer in writers:
                writer.start()
            time.sleep(1.0)  # let the writes take their threads
            readers = [
                threading.Thread(target=read, args=(path,))
                for path in ("/v1/tasks", "/v1/jobs/nope", "/v1/tasks/reviews/examples", "/readyz")
            ]
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(5)
            slow = {path: seconds for path, seconds in timings.items() if seconds > 1.0}
            assert len(timings) == len(readers) and not slow, timings
            assert statuses == []  # the reads answered while every write was still blocked
        finally:
            release.set()
            for writer in writers:
                writer.join(60)
        assert statuses == [201] * len(writers)
