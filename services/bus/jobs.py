"""Training jobs and published checkpoints on the bus.

Jobs are entries on one stream read by the `trainers` consumer group: a
worker acknowledges (XACK) a job only after publishing its checkpoint, and a
job left pending by a crashed worker is taken over with XAUTOCLAIM. A job's
state, progress and result live in a hash the api reads.

A checkpoint travels by pointer: its directory (written atomically on the
shared artifacts volume) and the sha256 of its manifest, appended to the
task's checkpoints stream, with the task's `current` key set to the newest.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import redis

JOBS_STREAM = "openbook:jobs"
GROUP = "trainers"


def job_key(job_id: str) -> str:
    return f"openbook:job:{job_id}"


def checkpoints_key(task: str) -> str:
    return f"openbook:task:{task}:checkpoints"


def current_key(task: str) -> str:
    return f"openbook:task:{task}:current"


@dataclass(frozen=True)
class Job:
    id: str
    task: str
    method: str
    train_config: dict[str, Any]


@dataclass(frozen=True)
class Published:
    version: str
    path: str
    manifest_sha256: str
    log_offset: str  # the last example-log entry the checkpoint's store covers


def _durable(client: redis.Redis) -> None:
    local, _ = client.execute_command("WAITAOF", 1, 0, 5000)
    if int(local) < 1:
        raise RuntimeError("Redis did not confirm the write on disk (is appendonly on?)")


class JobQueue:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def submit(self, task: str, method: str, train_config: dict[str, Any]) -> str:
        job_id = uuid.uuid4().hex
        record = {
            "id": job_id,
            "task": task,
            "method": method,
            "train_config": json.dumps(train_config),
            "state": "queued",
            "progress": 0.0,
            "created": time.time(),
        }
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(job_key(job_id), mapping=record)
            pipe.xadd(JOBS_STREAM, {"job": job_id})
            pipe.execute()
        _durable(self.client)
        return job_id

    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = self.client.hgetall(job_key(job_id))
        if not raw:
            return None
        record: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
        record["progress"] = float(record["progress"])
        record["train_config"] = json.loads(record["train_config"])
        for name in ("metrics", "published"):
            if name in record:
                record[name] = json.loads(record[name])
        return record

    def update(self, job_id: str, **fields: Any) -> None:
        encoded = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in fields.items()}
        self.client.hset(job_key(job_id), mapping=encoded)

    def claim(
        self, consumer: str, *, block_ms: int = 1000, min_idle_ms: int = 60_000
    ) -> tuple[str, Job] | None:
        """The next job for `consumer`: one a crashed worker left pending too long, else a new one."""
        try:
            self.client.xgroup_create(JOBS_STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        _, stale, _ = self.client.xautoclaim(JOBS_STREAM, GROUP, consumer, min_idle_ms, count=1)
        entries = stale or [
            entry
            for _, batch in self.client.xreadgroup(
                GROUP, consumer, {JOBS_STREAM: ">"}, count=1, block=block_ms
            )
            for entry in batch
        ]
        if not entries:
            return None
        entry_id, fields = entries[0]
        record = self.get(fields[b"job"].decode())
        if record is None:  # the job record is gone (e.g. its task was deleted): drop the entry
            self.ack(entry_id.decode())
            return None
        job = Job(record["id"], record["task"], record["method"], record["train_config"])
        return entry_id.decode(), job

    def ack(self, entry_id: str) -> None:
        self.client.xack(JOBS_STREAM, GROUP, entry_id)


def publish_checkpoint(client: redis.Redis, task: str, published: Published) -> None:
    fields = asdict(published)
    with client.pipeline(transaction=True) as pipe:
        pipe.xadd(checkpoints_key(task), fields)
        pipe.set(current_key(task), json.dumps(fields))
        pipe.execute()
    _durable(client)


def current_checkpoint(client: redis.Redis, task: str) -> Published | None:
    raw = client.get(current_key(task))
    return None if raw is None else Published(**json.loads(raw))
