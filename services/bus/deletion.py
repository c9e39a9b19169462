"""Deleting a task: everything it owned goes, so a task created again under its name starts clean.

One script removes the spec, the example log (stream, id index, id counter,
count of adds), the pool of unlabelled texts, the checkpoints stream, the
`current` pointer, the versions records and the automatic training's state,
and cancels the task's
queued and running jobs (their records stay a day, to say so). It also bumps
the task's generation, so a job still training for the deleted task cannot
publish into a task created again under the same name. Then the task's
artifacts directory is removed: Redis first, because it is the truth; if the
process dies in between, deleting the name again reclaims the disk.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import redis

from services.bus.durability import wait_durable
from services.bus.examples_log import ExampleLog
from services.bus.jobs import JOB_PREFIX, task_jobs_key
from services.bus.keys import GENERATIONS_KEY, TASK_NAME_PATTERN, TASKS_KEY, autotrain_key
from services.bus.pool import pool_keys
from services.bus.versions import checkpoints_key, current_key, versions_key

CANCELLED_JOB_TTL_S = 24 * 3600

_DELETE_TASK = """
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
for _, job in ipairs(redis.call('SMEMBERS', KEYS[8])) do
  local key = ARGV[2] .. job
  local state = redis.call('HGET', key, 'state')
  if state == 'queued' or state == 'running' then
    redis.call('HSET', key, 'state', 'cancelled', 'error', 'its task was deleted')
  end
  redis.call('EXPIRE', key, ARGV[3])
end
redis.call('DEL', unpack(KEYS, 8))
return existed
"""


def delete_task(client: redis.Redis, name: str, artifacts_dir: str | Path) -> bool:
    """Delete task `name` and all it owned; False if there was no such task (leftovers go all the same)."""
    if not re.fullmatch(TASK_NAME_PATTERN, name):  # no task has such a name, and it is no safe path
        return False
    log = ExampleLog(client, name)
    keys = [TASKS_KEY, GENERATIONS_KEY, log.stream_key, log.ids_key, log.counter_key]
    keys += [checkpoints_key(name), current_key(name), task_jobs_key(name), *pool_keys(name)]
    keys += [versions_key(name), log.added_key, autotrain_key(name)]
    existed = client.register_script(_DELETE_TASK)(keys=keys, args=[name, JOB_PREFIX, CANCELLED_JOB_TTL_S])
    wait_durable(client)
    shutil.rmtree(Path(artifacts_dir) / name, ignore_errors=True)
    return bool(existed)
