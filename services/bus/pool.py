"""A task's pool of unlabelled texts, which active learning suggests for labelling.

Per task, a hash id -> text (JSON) and a sorted set of the ids (scored by the id itself, so the pool
pages in id order without sorting it whole). Ids are the client's, at most 2^53-1, so that a score (a
double) holds each exactly. An add is acknowledged once Redis has it on disk, like an example's: a
retried POST is idempotent (same id, same text: a no-op), an id held with another text is a conflict,
and a batch with a conflict writes nothing (one Lua script checks and writes atomically). Labelling a
text (an example posted under its id) takes it out of the pool; deleting the task deletes the pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import redis
from openbook.prompting import TextInput

from services.bus.durability import wait_durable
from services.bus.examples_log import LogError

MAX_POOL_ID = 2**53 - 1  # the largest id a sorted-set score (a double) holds exactly

_ADD = """
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local existing = redis.call('HGET', KEYS[1], ARGV[2 + 2 * i])
  if existing and existing ~= ARGV[3 + 2 * i] then
    return redis.error_reply('CONFLICT ' .. ARGV[2 + 2 * i])
  end
end
local created = {}
for i = 0, n - 1 do
  local id = ARGV[2 + 2 * i]
  created[i + 1] = redis.call('HSETNX', KEYS[1], id, ARGV[3 + 2 * i])
  redis.call('ZADD', KEYS[2], id, id)
end
return created
"""


class PoolConflict(ValueError):
    def __init__(self, text_id: int) -> None:
        super().__init__(f"pool id {text_id} is already in the pool with a different text")
        self.text_id = text_id


@dataclass(frozen=True)
class PoolText:
    id: int
    text: TextInput


def pool_keys(task: str) -> tuple[str, str]:
    """The pool's keys: the texts (hash) and their ids in order (sorted set)."""
    prefix = f"openbook:task:{task}"
    return f"{prefix}:pool", f"{prefix}:pool-ids"


class TextPool:
    def __init__(self, client: redis.Redis, task: str) -> None:
        self.client = client
        self.texts_key, self.ids_key = pool_keys(task)
        self._add = client.register_script(_ADD)

    def add(self, texts: Sequence[PoolText]) -> list[bool]:
        """Add atomically and durably; per text, whether it is new. PoolConflict (nothing written) on a
        changed id."""
        ids = [t.id for t in texts]
        for text_id in ids:
            if not 0 <= text_id <= MAX_POOL_ID:
                raise ValueError(f"pool id {text_id} is outside 0..2^53-1")
        if len(set(ids)) != len(ids):
            raise ValueError("a batch repeats a pool id")
        args: list[str | int] = [len(texts)]
        for text in texts:
            args += [str(text.id), _payload(text.text)]
        try:
            created = self._add(keys=[self.texts_key, self.ids_key], args=args)
        except redis.ResponseError as error:
            if str(error).startswith("CONFLICT"):
                raise PoolConflict(int(str(error).split()[1])) from None
            raise
        _wait_durable(self.client)
        return [bool(c) for c in created]

    def page(self, after: int, limit: int) -> tuple[list[PoolText], int | None]:
        """Up to `limit` texts with ids over `after`, in id order; and the `after` of the next page."""
        ids = cast(
            list[bytes], self.client.zrangebyscore(self.ids_key, f"({after}", "+inf", start=0, num=limit + 1)
        )
        texts = self._texts(ids[:limit])
        return texts, (texts[-1].id if len(ids) > limit and texts else None)

    def first(self, count: int) -> list[PoolText]:
        """The `count` texts with the smallest ids."""
        return self._texts(cast(list[bytes], self.client.zrange(self.ids_key, 0, count - 1)))

    def remove(self, ids: Iterable[int]) -> int:
        """Take texts out of the pool (durably); how many it held."""
        members = [str(i) for i in ids]
        if not members:
            return 0
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.texts_key, *members)
        pipe.zrem(self.ids_key, *members)
        removed, _ = pipe.execute()
        if removed:
            _wait_durable(self.client)
        return int(removed)

    def __len__(self) -> int:
        return int(self.client.zcard(self.ids_key))

    def _texts(self, ids: Sequence[bytes]) -> list[PoolText]:
        if not ids:
            return []
        raw = cast(list[bytes | None], self.client.hmget(self.texts_key, list(ids)))
        # A text removed between the two reads is skipped: it has left the pool.
        return [PoolText(int(i), _text(r)) for i, r in zip(ids, raw, strict=True) if r is not None]


def _payload(text: TextInput) -> str:
    return json.dumps(text if isinstance(text, str) else list(text), ensure_ascii=False)


def _text(raw: bytes) -> TextInput:
    text = json.loads(raw)
    return text if isinstance(text, str) else tuple(text)


def _wait_durable(client: redis.Redis) -> None:
    try:
        wait_durable(client)  # the helper the task deletion and the job queue use
    except RuntimeError as error:  # as the example log does: the api answers 503, retry
        raise LogError(str(error)) from None
