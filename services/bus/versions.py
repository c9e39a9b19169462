"""A task's model versions: the served checkpoint, the records, promotion (rollback), pinning, retention.

A checkpoint travels by pointer: its directory (written atomically on the
shared artifacts volume) and the sha256 of its manifest, appended to the
task's checkpoints stream, with the task's `current` key set to the newest.

Every checkpoint a job writes gets a record in the task's versions hash
(`openbook:task:<task>:versions`, version -> JSON), written by the script that
publishes it or keeps it as rejected (publish_checkpoint), also for a
candidate the promotion gate rejected, which is never published. A record's
state is `serving` (the task's `current` pointer names it), `rejected` (the
promotion gate turned it down; never served) or `retired` (served once).

Promoting a version serves it as a publish does: its pointer is appended to the
checkpoints stream, which every replica follows, and `current` is set. Any
recorded version may be promoted, a rejected one too: that is an operator's
explicit choice.

Retention keeps the serving version, the pinned ones and the newest `keep`,
and deletes the others: one script chooses the victims and removes their
records, so a version is either still recorded (and can be promoted) or gone
(and promotion answers that it is unknown), never half of each. Only then are
the victims' directories removed. A replica that already loaded a deleted
version keeps it in memory; no replica is asked to load one, because
`current` never names a victim.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from services.bus.durability import wait_durable
from services.bus.jobs import Job, TaskGone
from services.bus.keys import GENERATIONS_KEY, TASKS_KEY

# Lua helpers over a task's versions hash (version -> JSON record). `serve` points the task at a recorded
# version as a publish does: the version serving until then is retired, the pointer is appended to the
# checkpoints stream (every replica follows it) and `current` is set.
VERSIONS_LUA = """
local function set_state(versions, version, state)
  local raw = redis.call('HGET', versions, version)
  if raw then
    local record = cjson.decode(raw)
    record['state'] = state
    redis.call('HSET', versions, version, cjson.encode(record))
  end
end
local function serve(versions, checkpoints, current, record)
  local previous = redis.call('GET', current)
  if previous then
    local old = cjson.decode(previous)['version']
    if old ~= record['version'] then
      set_state(versions, old, 'retired')
    end
  end
  record['state'] = 'serving'
  redis.call('HSET', versions, record['version'], cjson.encode(record))
  local pointer = {version = record['version'], path = record['path'],
    manifest_sha256 = record['manifest_sha256'], log_offset = record['log_offset']}
  redis.call('XADD', checkpoints, '*', 'version', pointer.version, 'path', pointer.path,
    'manifest_sha256', pointer.manifest_sha256, 'log_offset', pointer.log_offset)
  redis.call('SET', current, cjson.encode(pointer))
end
"""

# A job's checkpoint, for the task generation the job was made for only: with a version record (ARGV[3]),
# served (ARGV[4] 'serve') or kept as rejected, in one step; without one, a bare pointer is published.
_PUBLISH = (
    VERSIONS_LUA
    + """
local generation = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 or generation ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('XADD', KEYS[3], '*', unpack(ARGV, 6))
  redis.call('SET', KEYS[4], ARGV[5])
  return 1
end
local record = cjson.decode(ARGV[3])
if ARGV[4] == 'serve' then
  serve(KEYS[5], KEYS[3], KEYS[4], record)
else
  record['state'] = 'rejected'
  redis.call('HSET', KEYS[5], record['version'], cjson.encode(record))
end
return 1
"""
)

# What a version's directory may be called: its records name directories under the task's, nothing else.
VERSION_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"

_PROMOTE = (
    VERSIONS_LUA
    + """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 'notask'
end
local raw = redis.call('HGET', KEYS[2], ARGV[2])
if not raw then
  return 'noversion'
end
local record = cjson.decode(raw)
local current = redis.call('GET', KEYS[4])
if not (current and cjson.decode(current)['version'] == ARGV[2]) then
  serve(KEYS[2], KEYS[3], KEYS[4], record)
end
return redis.call('HGET', KEYS[2], ARGV[2])
"""
)

_PIN = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return false
end
local record = cjson.decode(raw)
record['pinned'] = ARGV[2] == '1'
local encoded = cjson.encode(record)
redis.call('HSET', KEYS[1], ARGV[1], encoded)
return encoded
"""

# Newest first by creation time; the serving and pinned versions are never victims.
_RETAIN = """
local keep = tonumber(ARGV[1])
local current = redis.call('GET', KEYS[2])
local serving = current and cjson.decode(current)['version']
local flat = redis.call('HGETALL', KEYS[1])
local rows = {}
for i = 1, #flat, 2 do
  local record = cjson.decode(flat[i + 1])
  table.insert(rows, {flat[i], tonumber(record['created']) or 0, record['pinned'] == true})
end
table.sort(rows, function(a, b)
  if a[2] ~= b[2] then return a[2] > b[2] end
  return a[1] > b[1]
end)
local victims = {}
for i, row in ipairs(rows) do
  if i > keep and not row[3] and row[1] ~= serving then
    redis.call('HDEL', KEYS[1], row[1])
    table.insert(victims, row[1])
  end
end
return victims
"""


@dataclass(frozen=True)
class Published:
    version: str
    path: str
    manifest_sha256: str
    log_offset: str  # the last example-log entry the checkpoint's store covers


class UnknownVersion(LookupError):
    pass


def checkpoints_key(task: str) -> str:
    return f"openbook:task:{task}:checkpoints"


def current_key(task: str) -> str:
    return f"openbook:task:{task}:current"


def versions_key(task: str) -> str:
    return f"openbook:task:{task}:versions"


def directory_bytes(path: str | Path) -> int:
    """Bytes of the files below `path` (0 when it is not there); a file deleted meanwhile counts 0."""
    total = 0
    for file in Path(path).rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += file.stat().st_size if file.is_file() else 0
    return total


def new_record(
    *,
    version: str,
    method: str,
    job: str,
    gate: dict[str, Any] | None,
    dev_metrics: dict[str, Any],
    train: int,
    dev: int,
    size_bytes: int,
    created: float,
) -> dict[str, Any]:
    """A version's record, less what publishing adds (its pointer, its state)."""
    return {
        "version": version,
        "method": method,
        "job": job,
        "gate": gate,
        "dev_metrics": dev_metrics,
        "examples": {"train": train, "dev": dev},
        "size_bytes": size_bytes,
        "created": created,
        "pinned": False,
    }


def publish_checkpoint(
    client: redis.Redis,
    job: Job,
    published: Published,
    record: dict[str, Any] | None = None,
    *,
    serve: bool = True,
) -> None:
    """Point the job's task at a checkpoint; TaskGone if the task is not the one the job was made for.

    With its version `record` (new_record), the record is written in the same step: as the
    serving version, or, with `serve=False`, as a rejected one, and then nothing is published.
    """
    fields = asdict(published)
    keys = [
        TASKS_KEY,
        GENERATIONS_KEY,
        checkpoints_key(job.task),
        current_key(job.task),
        versions_key(job.task),
    ]
    args = [job.task, job.generation, "" if record is None else json.dumps({**record, **fields})]
    args += [
        "serve" if serve else "reject",
        json.dumps(fields),
        *(item for pair in fields.items() for item in pair),
    ]
    if not client.register_script(_PUBLISH)(keys=keys, args=args):
        raise TaskGone(job.task, published.path)
    wait_durable(client)


def current_checkpoint(client: redis.Redis, task: str) -> Published | None:
    raw = client.get(current_key(task))
    return None if raw is None else Published(**json.loads(raw))


def list_versions(client: redis.Redis, task: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(the serving version or None, every recorded version newest first)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(current_key(task))
        pipe.hvals(versions_key(task))
        current, raw = pipe.execute()
    serving = None if current is None else json.loads(current)["version"]
    records = [json.loads(value) for value in raw]
    for record in records:  # a pointer published by hand (no record) leaves the last served one retired
        if record["state"] == "serving" and record["version"] != serving:
            record["state"] = "retired"
    records.sort(key=lambda r: (r["created"], r["version"]), reverse=True)
    return serving, records


def promote(client: redis.Redis, task: str, version: str) -> dict[str, Any]:
    """Serve `version` (a rollback when it is older); UnknownVersion if it is not recorded."""
    keys = [TASKS_KEY, versions_key(task), checkpoints_key(task), current_key(task)]
    answer = client.register_script(_PROMOTE)(keys=keys, args=[task, version])
    if answer in (b"notask", b"noversion"):
        raise UnknownVersion(f"no task {task!r}" if answer == b"notask" else f"no version {version!r}")
    wait_durable(client)
    return json.loads(answer)


def set_pinned(client: redis.Redis, task: str, version: str, pinned: bool) -> dict[str, Any]:
    answer = client.register_script(_PIN)(keys=[versions_key(task)], args=[version, int(pinned)])
    if answer is None:
        raise UnknownVersion(f"no version {version!r}")
    wait_durable(client)
    return json.loads(answer)


def retain(client: redis.Redis, task: str, artifacts_dir: str | Path, keep: int) -> list[str]:
    """Delete the versions retention does not keep, records then directories; returns them."""
    victims = [
        v.decode()
        for v in client.register_script(_RETAIN)(keys=[versions_key(task), current_key(task)], args=[keep])
    ]
    if victims:
        wait_durable(client)  # the records are gone for good before their directories go
    for version in victims:
        if re.fullmatch(VERSION_PATTERN, version) and version not in (".", ".."):
            shutil.rmtree(Path(artifacts_dir) / task / version, ignore_errors=True)
    return victims
