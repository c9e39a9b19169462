"""Training jobs on the bus.

Jobs are entries on one stream read by the `trainers` consumer group. A job's
state (queued, running, succeeded, failed, cancelled), progress and result
live in a hash the api reads. Each change of state is a script that checks
the state it moves from, so a cancelled job stays cancelled whatever its
worker does next, and a worker whose job was taken over stops writing to it.

Delivery: a worker acknowledges (XACK) a job once it is finished. A claim
takes, in this order, the consumer's own pending entries (a worker restarted
under its name resumes its job at once), entries another consumer left
pending longer than `min_idle_ms` (XAUTOCLAIM: a crashed worker; a live one
keeps its entry fresh with `touch` from its heartbeat, so a long job is not
taken over), then new entries. When a worker is known to be gone, `release`
marks its jobs queued and backdates its entries (XCLAIM ... IDLE), so any
worker takes them at its next claim instead of after the idle time.

A job belongs to one generation of its task (task_spec.GENERATIONS_KEY): a
job whose task was deleted is not started, and its checkpoint is refused at
publication (TaskGone, from versions.publish_checkpoint), also when a task of
the same name exists again.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT

from services.bus.durability import wait_durable
from services.bus.keys import GENERATIONS_KEY, TASKS_KEY
from services.bus.replies import Fields, StreamBatches, StreamEntry

JOBS_STREAM = "openbook:jobs"
GROUP = "trainers"
JOB_PREFIX = "openbook:job:"
# What `release` backdates an entry's delivery by: more than any claimer's idle threshold.
RELEASED_IDLE_MS = 24 * 3600 * 1000

# Lua: queue a job for `task` (its record, the task's job set, a stream entry), at the task's generation.
# `keys` are job_keys(task, job_id)'s, in that order. Shared by a manual submit and the automatic trigger.
QUEUE_JOB = """
local function queue_job(keys, task, job_id, method, train_config, created, trigger, force)
  local generation = redis.call('HGET', keys[2], task) or '0'
  redis.call('HSET', keys[3], 'id', job_id, 'task', task, 'method', method, 'train_config', train_config,
    'state', 'queued', 'progress', '0.0', 'created', created, 'generation', generation, 'trigger', trigger,
    'force', force)
  redis.call('SADD', keys[4], job_id)
  redis.call('XADD', keys[5], '*', 'job', job_id)
end
"""

_SUBMIT = (
    QUEUE_JOB
    + """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return redis.error_reply('NOTASK')
end
queue_job(KEYS, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'manual', ARGV[6])
"""
)

# A claimed job runs only if it is still queued or running and its task is the generation it was made for.
_START = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return 'missing'
end
if state ~= 'queued' and state ~= 'running' then
  return state
end
local task = redis.call('HGET', KEYS[1], 'task')
local generation = redis.call('HGET', KEYS[1], 'generation')
if redis.call('HEXISTS', KEYS[2], task) == 0 or (redis.call('HGET', KEYS[3], task) or '0') ~= generation then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'error', 'its task was deleted')
  return 'cancelled'
end
redis.call('HSET', KEYS[1], 'state', 'running', 'progress', '0.0', 'started', ARGV[2], 'worker', ARGV[1])
redis.call('HDEL', KEYS[1], 'error', 'loss', 'stage', 'stage_since')
return 'running'
"""

_IF_RUNNING_BY = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' or redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

_REQUEUE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'queued', 'progress', '0.0', 'error', ARGV[1])
redis.call('HDEL', KEYS[1], 'stage', 'stage_since')
return 1
"""

# Acknowledge or refresh an entry only while it is this consumer's: once another took it over, it is theirs.
_IF_MINE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[3]) == 0 then
  return 0
end
"""
_ACK = (
    _IF_MINE
    + """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])  -- done with: the stream keeps only unfinished jobs
return 1
"""
)
_TOUCH = (
    _IF_MINE
    + """
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'JUSTID')
return 1
"""
)


def job_key(job_id: str) -> str:
    return f"{JOB_PREFIX}{job_id}"


def task_jobs_key(task: str) -> str:
    return f"openbook:task:{task}:jobs"


def job_keys(task: str, job_id: str) -> list[str]:
    """The keys QUEUE_JOB's `queue_job` writes and reads, in its order."""
    return [TASKS_KEY, GENERATIONS_KEY, job_key(job_id), task_jobs_key(task), JOBS_STREAM]


class TaskGone(LookupError):
    """The job's task was deleted since the job was submitted (a task of its name may exist again)."""

    def __init__(self, task: str, checkpoint: str | None = None) -> None:
        super().__init__(f"task {task!r} was deleted")
        self.task = task
        self.checkpoint = checkpoint  # the refused checkpoint's directory, when publishing was refused


@dataclass(frozen=True)
class Job:
    id: str
    task: str
    method: str
    train_config: dict[str, Any]
    generation: str = "0"  # the task's generation when the job was submitted
    force: bool = False  # publish without the promotion gate


class JobQueue:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._submit = client.register_script(_SUBMIT)
        self._start = client.register_script(_START)
        self._if_running_by = client.register_script(_IF_RUNNING_BY)
        self._requeue = client.register_script(_REQUEUE)
        self._ack = client.register_script(_ACK)
        self._touch = client.register_script(_TOUCH)

    def submit(self, task: str, method: str, train_config: dict[str, Any], *, force: bool = False) -> str:
        """Queue a job for an existing task (TaskGone otherwise); returns its id.

        `force`: its checkpoint is published without the promotion gate (services/trainer/worker.py).
        """
        job_id = uuid.uuid4().hex
        try:
            args: list[EncodableT] = [task, job_id, method, json.dumps(train_config), time.time(), int(force)]
            self._submit(keys=job_keys(task, job_id), args=args)
        except redis.ResponseError as error:
            if "NOTASK" in str(error):
                raise TaskGone(task) from None
            raise
        wait_durable(self.client)
        return job_id

    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = cast(Fields, self.client.hgetall(job_key(job_id)))
        if not raw:
            return None
        record: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
        record["progress"] = float(record["progress"])
        record["train_config"] = json.loads(record["train_config"])
        record["force"] = record.get("force") == "1"
        for name in ("metrics", "published", "gate"):
            if name in record:
                record[name] = json.loads(record[name])
        return record

    def of_task(self, task: str, limit: int) -> list[dict[str, Any]]:
        """The task's newest `limit` jobs, newest first."""
        job_ids = [raw.decode() for raw in cast(set[bytes], self.client.smembers(task_jobs_key(task)))]
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(job_key(job_id), "created")
        created = {i: float(c) for i, c in zip(job_ids, pipe.execute(), strict=True) if c is not None}
        newest = sorted(created, key=lambda i: (created[i], i), reverse=True)[:limit]
        return [record for job_id in newest if (record := self.get(job_id)) is not None]

    def update(self, job_id: str, **fields: Any) -> None:
        self.client.hset(job_key(job_id), mapping=_encoded(fields))

    def report(self, job_id: str, consumer: str, **fields: Any) -> bool:
        """Update a job `consumer` runs; False (nothing written) once it was cancelled or taken over."""
        args = [consumer, *(item for pair in _encoded(fields).items() for item in pair)]
        return bool(self._if_running_by(keys=[job_key(job_id)], args=args))

    def claim(
        self, consumer: str, *, block_ms: int = 1000, min_idle_ms: int = 60_000
    ) -> tuple[str, Job] | None:
        """The next job for `consumer`, marked running; None when there is none to run now."""
        try:
            self.client.xgroup_create(JOBS_STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        entries = (
            self._read(consumer, "0", block_ms=None)  # its own: a previous life's, not finished
            or self.client.xautoclaim(JOBS_STREAM, GROUP, consumer, min_idle_ms, count=1)[1]
            or self._read(consumer, ">", block_ms=block_ms)
        )
        if not entries:
            return None
        raw_id, fields = entries[0]
        entry_id = raw_id.decode()
        job_id = fields[b"job"].decode() if fields else None  # no fields: the entry was deleted
        state = b"missing"
        if job_id is not None:
            keys = [job_key(job_id), TASKS_KEY, GENERATIONS_KEY]
            state = self._start(keys=keys, args=[consumer, time.time()])
        if state != b"running" or (record := self.get(job_id)) is None:  # type: ignore[arg-type]
            self.ack(entry_id, consumer)  # finished, cancelled or gone: nothing to run
            return None
        job = Job(
            record["id"],
            record["task"],
            record["method"],
            record["train_config"],
            record["generation"],
            record["force"],
        )
        return entry_id, job

    def _read(self, consumer: str, start: str, *, block_ms: int | None) -> list[StreamEntry]:
        batches = cast(
            "StreamBatches | None",
            self.client.xreadgroup(GROUP, consumer, {JOBS_STREAM: start}, count=1, block=block_ms),
        )
        return [entry for _, batch in batches or [] for entry in batch]

    def ack(self, entry_id: str, consumer: str) -> bool:
        """Acknowledge (and drop) an entry, if it is still `consumer`'s."""
        return bool(self._ack(keys=[JOBS_STREAM], args=[GROUP, entry_id, consumer]))

    def touch(self, entry_id: str, consumer: str) -> bool:
        """Reset the entry's idle time while its worker lives, so no XAUTOCLAIM takes it over."""
        return bool(self._touch(keys=[JOBS_STREAM], args=[GROUP, entry_id, consumer]))

    def release(self, consumer: str, reason: str) -> list[str]:
        """The jobs `consumer` holds (it died or stops) are queued again, claimable by anyone at once."""
        released = []
        pending = self.client.xpending_range(JOBS_STREAM, GROUP, "-", "+", 100, consumername=consumer)
        for entry in pending:
            entry_id = cast(bytes, entry["message_id"]).decode()
            stored = cast(list[StreamEntry], self.client.xrange(JOBS_STREAM, entry_id, entry_id))
            job_id = stored[0][1][b"job"].decode() if stored else None
            if job_id is not None and self._requeue(keys=[job_key(job_id)], args=[reason]):
                self.client.xclaim(
                    JOBS_STREAM, GROUP, consumer, 0, [entry_id], idle=RELEASED_IDLE_MS, justid=True
                )
                released.append(job_id)
            else:
                self.ack(entry_id, consumer)
        return released


def _encoded(fields: dict[str, Any]) -> dict[EncodableT, EncodableT]:
    return {k: json.dumps(v) if isinstance(v, dict) else v for k, v in fields.items()}
