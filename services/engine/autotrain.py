"""Automatic training: a task whose `training.auto` is on queues a job every `every` examples added.

The clock is the task's count of examples ever added (examples_log: the append script counts each new
one; retries and deletes do not move it). The task's autotrain hash keeps the count its last automatic
job was queued at (`position`, 0 at first) and that job's id. One script decides and queues: while the
last automatic job is queued or running no other is queued, so growth meanwhile coalesces; once it has
ended, the next call finds the count `every` past its position and queues exactly one more. The api calls
`queue_if_due` after each acknowledged append (and after a PATCH of the settings), the worker after each
job ends. Every call is idempotent: calling again, or from two replicas at once, queues nothing more.

A job killed with its worker is queued again as any job is (jobs.JobQueue.release, XAUTOCLAIM); it is
still queued or running meanwhile, so no second copy is made.

The settings change by compare-and-set (`update_training`): the spec is written only if it and the
task's generation are still the ones read, so a PATCH never lands on a task deleted and created again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError
from redis.typing import EncodableT

from services.bus.durability import wait_durable
from services.bus.examples_log import ExampleLog
from services.bus.jobs import JOB_PREFIX, QUEUE_JOB, job_keys
from services.bus.keys import GENERATIONS_KEY, TASKS_KEY, autotrain_key
from services.engine.task_spec import Task

# A spec that changed between the read and the script is read again; a few rounds settle any race.
_ATTEMPTS = 5

# KEYS: job_keys(task, job id), the task's added counter, its autotrain hash.
# ARGV: task, job id, method, train_config, created, the spec the caller read, every, the job key prefix.
_TRIGGER = (
    QUEUE_JOB
    + """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[6] then
  return 'changed'
end
local added = tonumber(redis.call('GET', KEYS[6]) or '0')
local position = tonumber(redis.call('HGET', KEYS[7], 'position') or '0')
if added - position < tonumber(ARGV[7]) then
  return false
end
local last = redis.call('HGET', KEYS[7], 'job')
if last then
  local state = redis.call('HGET', ARGV[8] .. last, 'state')
  if state == 'queued' or state == 'running' then
    return false
  end
end
queue_job(KEYS, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'auto', '0')
redis.call('HSET', KEYS[7], 'position', added, 'job', ARGV[2])
return 'queued'
"""
)

_REPLACE_SPEC = """
local generation = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] or generation ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
return 1
"""


class SpecChanged(RuntimeError):
    """The task's spec kept changing under an update; nothing was written."""


def queue_if_due(client: redis.Redis, task: str) -> str | None:
    """Queue the task's next automatic job if it is due; its id, or None when none was queued."""
    trigger = client.register_script(_TRIGGER)
    for _ in range(_ATTEMPTS):
        raw = client.hget(TASKS_KEY, task)
        if raw is None:
            return None
        try:
            spec = Task.model_validate_json(raw)
        except ValidationError:
            return None  # a spec this version cannot read is not trained
        training = spec.training
        if not training.auto:
            return None
        job_id = uuid.uuid4().hex
        keys = [*job_keys(task, job_id), ExampleLog(client, task).added_key, autotrain_key(task)]
        config = json.dumps(training.train_config())
        method = training.method or spec.method
        args: list[EncodableT] = [task, job_id, method, config, time.time(), raw, training.every, JOB_PREFIX]
        outcome = trigger(keys=keys, args=args)
        if outcome == b"changed":
            continue
        if outcome is None:
            return None
        wait_durable(client)
        return job_id
    return None


def update_training(
    client: redis.Redis,
    name: str,
    changes: dict[str, Any],
    check: Callable[[Task], None],
    *,
    serving: dict[str, Any] | None = None,
) -> Task | None:
    """Merge `changes` over the task's training settings, set the serving settings in `serving` (e.g.
    `min_confidence`), and store the spec; None when there is no task.

    `check` raises on a spec that cannot train, and then nothing is written. A spec changed meanwhile by
    another update is read again and merged over; a task deleted meanwhile is None, also when a task of
    its name exists again (another generation). SpecChanged when updates kept racing it.
    """
    replace = client.register_script(_REPLACE_SPEC)
    first = None  # the generation found first: the task this update is for
    for _ in range(_ATTEMPTS):
        pipe = client.pipeline(transaction=True)
        pipe.hget(TASKS_KEY, name)
        pipe.hget(GENERATIONS_KEY, name)
        raw, generation = pipe.execute()
        generation = generation or b"0"
        first = first or generation
        if raw is None or generation != first:
            return None
        task = Task.model_validate_json(raw)
        training = task.training.merged(changes)
        updated = Task.model_validate({**task.model_dump(), **(serving or {}), "training": training})
        check(updated)
        args = [name, raw, generation, updated.model_dump_json()]
        if replace(keys=[TASKS_KEY, GENERATIONS_KEY], args=args):
            wait_durable(client)
            return updated
    raise SpecChanged(f"task {name!r} kept changing while its training settings were updated; retry")
