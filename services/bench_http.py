"""The bench's clients of a running api (services/bench.py): lean keep-alive requests, and many clients at
once from a process of their own."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from collections.abc import Callable
from urllib.parse import SplitResult, urlsplit

import httpx


def post(connection: http.client.HTTPConnection, path: str, payload: dict) -> dict:
    """POST JSON on a keep-alive `http.client` connection; the decoded answer, which must be 2xx.

    The bench's clients use the standard library's `http.client`, the leanest client at hand: on a
    small machine a client's CPU is taken from the server being measured, and httpx spends several
    times more per request.
    """
    connection.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
    response = connection.getresponse()
    body = response.read()
    if not 200 <= response.status < 300:
        raise RuntimeError(f"POST {path} answered {response.status}: {body[:200]!r}")
    return json.loads(body)


def classify_one(connection: http.client.HTTPConnection, text: str) -> None:
    post(connection, "/v1/tasks/bench/classify", {"texts": [text]})


def seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def forward_counts(base: str) -> tuple[float, float]:
    """(forwards run, texts forwarded) so far, from the api's /metrics (summed over its workers)."""
    values = {}
    for line in httpx.get(f"{base}/metrics", timeout=60).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("openbook_forward_batch_texts_count", "openbook_forward_batch_texts_sum"):
            values[name] = float(value)
    return values["openbook_forward_batch_texts_count"], values["openbook_forward_batch_texts_sum"]


def connect(base: str) -> http.client.HTTPConnection:
    address = urlsplit(base)
    assert address.hostname is not None  # an api's base URL, http://host:port
    return http.client.HTTPConnection(address.hostname, address.port, timeout=600)


def with_clients(base: str, texts: list[str], clients: int, task: str = "bench") -> float:
    """Seconds for `clients` concurrent clients to classify `texts`, one text per request.

    The clients are coroutines on one event loop in a process of its own, each with a keep-alive
    connection speaking just enough HTTP/1.1 for these requests. Threads would not do: 32 client
    threads hand Python's GIL to each other as their answers arrive together, and that convoy, not
    the server, spread each wave of requests over about 100 ms.
    """
    return asyncio.run(load_async(urlsplit(base), texts, clients, task))


async def load_async(address: SplitResult, texts: list[str], clients: int, task: str) -> float:
    async def client_run(share: list[str]) -> None:
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            for text in share:
                body = json.dumps({"texts": [text]}).encode()
                writer.write(
                    b"POST /v1/tasks/%s/classify HTTP/1.1\r\nHost: bench\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (task.encode(), len(body), body)
                )
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                answer = await reader.readexactly(length)
                if status != 200:
                    raise RuntimeError(f"classify answered {status}: {answer[:200]!r}")
        finally:
            writer.close()
            await writer.wait_closed()

    started = time.perf_counter()
    await asyncio.gather(*(client_run(texts[i::clients]) for i in range(clients)))
    return time.perf_counter() - started
