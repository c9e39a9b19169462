"""The front: HTTP processes that gather single-text classify requests into one request to the replica.

A replica spends about 2.2-2.5 ms of Python on each request whatever it holds (docs/benchmarks.md, the
H100 profile: the HTTP server, routing, FastAPI and the hand-offs), so one text per request caps it near
450 texts/s while the device could forward thousands. A request of many texts pays that cost once. The
front is a plain ASGI app, without FastAPI, run in N processes on the public port in front of one
replica (`openbook serve` with `OPENBOOK_FRONT_WORKERS=N`). For `POST /v1/tasks/{task}/classify` it
sends the texts of every request waiting with the same task, key and options as one request to the
replica, and answers each with its own slice of the predictions. Everything else it passes through
unchanged.

When to send is the rule of the replica's micro-batcher (services/engine/batching.py), by waves: the
clients of one request to the replica send their next requests as their answers arrive, a few
milliseconds apart. A group of requests of one kind goes when nothing of its kind is on its way to the
replica and it holds as many requests as were waiting, and were answered, when the last one of its kind
returned, so a lone client waits for nothing and a wave goes whole; or when it has waited `max_wait`
seconds with nothing of its kind on its way (the wave thinned); or when it fills a request
(`max_texts` texts, the replica's `max_batch`, or `max_bytes`). While one is on its way, the requests
that arrive gather. Sending the first request of a wave at once instead, with the rest after it
returned, made the trips alternate between one text and all the others: two replica round trips a
wave, each paying the replica's per-request Python (`tests/services/test_front.py`).

A gathered request the replica refuses (a text over the limit in one of them, say) is not the answer
for every request in it: each is then sent again on its own, so each gets the answer it would have had
alone. Requests are gathered only with others of the same headers that decide access (the key) and the
same options, so a prediction never depends on who else was waiting.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from services.api.middleware import LimitBody

CLASSIFY = re.compile(r"^/v1/tasks/[^/]+/classify$")
# hop-by-hop headers and those the front sets itself, never passed on
_DROPPED = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade"}
_ACCESS = ("x-api-key", "authorization")  # the headers that decide what a request may do

Upstream = Callable[
    [str, str, list[tuple[str, str]], bytes], Awaitable[tuple[int, list[tuple[str, str]], bytes]]
]


_Key = tuple[str, tuple[tuple[str, str], ...], str]  # a group: path, access headers, options as JSON


@dataclass
class _Waiting:
    texts: list[Any]
    body: bytes  # as the client sent it: what is sent alone if the gathered request is refused
    answer: asyncio.Future[tuple[int, list[tuple[str, str]], bytes]]


@dataclass
class _Group:
    path: str
    headers: list[tuple[str, str]]
    options: dict[str, Any]
    members: list[_Waiting] = field(default_factory=list)
    texts: int = 0
    size: int = 0  # bytes of the texts, as their JSON
    timer: asyncio.TimerHandle | None = None
    due: bool = False  # it waited max_wait with nothing of its kind on its way


class Gatherer:
    """Gathers classify requests into groups by (path, access headers, options) and sends each group as
    one request, when nothing of its kind is on its way to the replica and its wave is in (`expected`)
    or it has waited `max_wait` seconds, or when it holds `max_texts` texts or `max_bytes` of them (the
    module's docstring)."""

    KINDS_REMEMBERED = 1024  # `expected` is kept for this many kinds, the least recently returned dropped

    def __init__(self, upstream: Upstream, *, max_texts: int, max_bytes: int, max_wait: float) -> None:
        self.upstream = upstream
        self.max_texts, self.max_bytes, self.max_wait = max_texts, max_bytes, max_wait
        self.groups: dict[_Key, _Group] = {}
        self.sent = 0  # requests sent to the replica, and how many of them held several (the tests read
        self.gathered = 0  # them)
        self.on_the_way: dict[_Key, int] = {}
        # requests a kind's next group waits for: those waiting when its last trip returned, and that trip's
        self.expected: OrderedDict[_Key, int] = OrderedDict()

    async def classify(
        self, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        texts = payload.get("texts") if isinstance(payload, dict) else None
        if not isinstance(texts, list) or not texts:
            return await self.upstream("POST", path, headers, body)  # the replica says what is wrong
        options = {name: value for name, value in payload.items() if name != "texts"}
        access = tuple(sorted((name, value) for name, value in headers if name in _ACCESS))
        key = (path, access, json.dumps(options, sort_keys=True))
        size = len(json.dumps(texts))
        group = self.groups.get(key)
        if group is not None and (
            group.texts + len(texts) > self.max_texts or group.size + size > self.max_bytes
        ):
            self._send(key)
            group = None
        if group is None:
            group = self.groups[key] = _Group(path, headers, options)
        waiting = _Waiting(texts, body, asyncio.get_running_loop().create_future())
        group.members.append(waiting)
        group.texts += len(texts)
        group.size += size
        if group.texts >= self.max_texts or group.size >= self.max_bytes:
            self._send(key)
        else:
            self._send_if_ready(key)
        return await waiting.answer

    def _send_if_ready(self, key: _Key) -> None:
        """Send `key`'s group if nothing of its kind is on its way and its wave is in, or it is due; else,
        once nothing is on its way, it is due `max_wait` seconds later (time spent behind a request on
        its way does not count: its wave cannot come before that request's answers)."""
        group = self.groups.get(key)
        if group is None or self.on_the_way.get(key):
            return
        if group.due or len(group.members) >= self.expected.get(key, 1):
            self._send(key)
        elif group.timer is None:
            group.timer = asyncio.get_running_loop().call_later(self.max_wait, self._due, key)

    def _due(self, key: _Key) -> None:
        group = self.groups.get(key)
        if group is not None:
            group.due = True
            self._send_if_ready(key)

    def _send(self, key: _Key) -> None:
        group = self.groups.pop(key, None)
        if group is None:
            return
        self.sent += 1
        self.gathered += len(group.members) > 1
        if group.timer is not None:
            group.timer.cancel()
        self.on_the_way[key] = self.on_the_way.get(key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._forward(group))
        members = len(group.members)
        task.add_done_callback(lambda done: self._returned(key, done, members))

    def _returned(self, key: _Key, done: asyncio.Task[None], members: int) -> None:
        done.exception()  # each member's future carries any error
        self.on_the_way[key] -= 1
        if not self.on_the_way[key]:
            del self.on_the_way[key]
        # the wave: what waits now, and this trip's clients, whose next requests follow their answers
        waiting = self.groups[key].members if key in self.groups else []
        self.expected[key] = len(waiting) + members
        self.expected.move_to_end(key)
        if len(self.expected) > self.KINDS_REMEMBERED:
            self.expected.popitem(last=False)
        self._send_if_ready(key)

    async def _forward(self, group: _Group) -> None:
        try:
            if len(group.members) == 1:
                member = group.members[0]
                member.answer.set_result(await self.upstream("POST", group.path, group.headers, member.body))
                return
            texts = [text for member in group.members for text in member.texts]
            body = json.dumps({**group.options, "texts": texts}).encode()
            status, headers, answer = await self.upstream("POST", group.path, group.headers, body)
            if status != 200:
                await asyncio.gather(*(self._alone(group, member) for member in group.members))
                return
            result = json.loads(answer)
            predictions = result.pop("predictions")
            start = 0
            for member in group.members:
                mine = predictions[start : start + len(member.texts)]
                start += len(member.texts)
                member.answer.set_result((200, headers, json.dumps({"predictions": mine, **result}).encode()))
        except Exception as error:  # the replica unreachable, say: every waiting request learns it
            for member in group.members:
                if not member.answer.done():
                    member.answer.set_exception(error)

    async def _alone(self, group: _Group, member: _Waiting) -> None:
        member.answer.set_result(await self.upstream("POST", group.path, group.headers, member.body))


class Front:
    """The ASGI app of one front process: classify requests through a `Gatherer`, the rest passed on."""

    def __init__(
        self,
        replica: str,
        *,
        max_texts: int = 64,
        max_bytes: int = 256_000,
        max_wait: float = 0.002,
    ) -> None:
        self.replica = replica
        self.client: httpx.AsyncClient | None = None
        self.gatherer = Gatherer(self._upstream, max_texts=max_texts, max_bytes=max_bytes, max_wait=max_wait)

    async def _upstream(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if self.client is None:  # made in the serving loop: an httpx client belongs to one
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            self.client = httpx.AsyncClient(base_url=self.replica, timeout=600, limits=limits)
        answer = await self.client.request(method, path, headers=headers, content=body)
        kept = [(name, value) for name, value in answer.headers.items() if name.lower() not in _DROPPED]
        kept = [(name, value) for name, value in kept if name.lower() != "content-encoding"]
        return answer.status_code, kept, answer.content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self)
            return
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name.decode("latin-1") not in _DROPPED
        ]
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        try:
            if scope["method"] == "POST" and CLASSIFY.match(scope["path"]) and not scope.get("query_string"):
                status, answer_headers, answer = await self.gatherer.classify(path, headers, body)
            else:
                status, answer_headers, answer = await self._upstream(scope["method"], path, headers, body)
        except httpx.HTTPError as error:
            reply = JSONResponse({"detail": f"the replica is unreachable: {error}"}, 502)
            await reply(scope, receive, send)
            return
        response = Response(answer, status)
        response.raw_headers = [
            *(
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in answer_headers
                if name.lower() != "content-length"
            ),
            (b"content-length", str(len(answer)).encode()),
        ]
        await response(scope, receive, send)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


async def _lifespan(receive: Receive, send: Send, front: Front) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await front.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


def front_app(replica: str, *, max_body_bytes: int, max_texts: int, **gathering: Any) -> LimitBody:
    """A front before the replica at `replica` (its base URL): it gathers at most `max_texts` texts into
    a request (the replica's `max_batch`) and refuses bodies over `max_body_bytes` as the replica does."""
    return LimitBody(Front(replica, max_texts=max_texts, **gathering), max_body_bytes)
