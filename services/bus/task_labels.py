"""A task's label set, changed in place: one label added or removed, its spec swapped atomically.

The spec is replaced only if it is still the one the change was decided on (compare-and-set in one
Lua script), so two concurrent changes cannot clobber each other: the second finds the spec changed
and decides again. The task's generation stays: it is the same task, its jobs and checkpoints hold.

Removing a label has one more condition: no current example may use it. The caller folds the log up
to an offset and finds none; the swap happens only if the log has not moved past that offset, and
the example log's own script refuses labels the stored spec lacks, so no example of the label can
slip in between.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import redis
from openbook.artifacts import MANIFEST_NAME

from services.bus.durability import wait_durable
from services.bus.keys import TASKS_KEY
from services.bus.versions import current_checkpoint


class Spec(Protocol):
    """A task's spec as the bus stores it: a name and its JSON (services/engine/task_spec.Task)."""

    name: str

    def model_dump_json(self) -> str: ...


_SWAP = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if ARGV[4] ~= '' then
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  local offset = last[1] and last[1][1] or '0-0'
  if offset ~= ARGV[4] then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


def swap_spec(
    client: redis.Redis,
    expected: bytes,
    task: Spec,
    *,
    log_key: str = "",
    log_offset: str = "",
) -> bool:
    """Store `task` in place of the spec `expected` (raw, as stored); False (nothing written) if the
    stored spec is another by now, or, given `log_key`, if the log's last entry is not `log_offset`."""
    keys = [TASKS_KEY, log_key or TASKS_KEY]  # a second key only to keep the script's key list fixed
    swapped = client.register_script(_SWAP)(
        keys=keys, args=[task.name, expected, task.model_dump_json(), log_offset]
    )
    if swapped:
        wait_durable(client)
    return bool(swapped)


def served_labels(client: redis.Redis, task: str) -> tuple[str | None, tuple[str, ...]]:
    """The version the task serves (None: the untrained base) and the labels it was trained with.

    Read from the checkpoint's manifest, on the artifacts volume every api replica reads checkpoints
    from; OSError or ValueError when it cannot be read.
    """
    published = current_checkpoint(client, task)
    if published is None:
        return None, ()
    manifest = json.loads((Path(published.path) / MANIFEST_NAME).read_text())
    return published.version, tuple(manifest["labels"])
