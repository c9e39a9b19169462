"""Durability of a write on the bus: a change is acknowledged only once Redis has it on disk.

WAITAOF waits (up to 5 s) until the writes before it are in the local append-only file; a job, a
version, a label or a pool change confirmed to its caller then survives a restart of Redis.
"""

from __future__ import annotations

import redis


def wait_durable(client: redis.Redis) -> None:
    local, _ = client.execute_command("WAITAOF", 1, 0, 5000)
    if int(local) < 1:
        raise RuntimeError("Redis did not confirm the write on disk (is appendonly on?)")
