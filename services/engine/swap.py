"""Hot swap: follow the checkpoints streams and swap each task's newest checkpoint in.

The work of one swap is `TaskRuntime.adopt` (verify, load, catch up, swap under
the task's lock); this thread only notices new checkpoints. A replica that
starts late reads each stream from the beginning, so it adopts the newest
checkpoint too.
"""

from __future__ import annotations

import logging
import threading
from typing import cast

import redis
from redis.typing import KeyT, StreamIdT

from services.bus.replies import StreamBatches
from services.bus.versions import Published, checkpoints_key
from services.engine.runtimes import Runtimes

logger = logging.getLogger(__name__)


def follow_checkpoints(runtimes: Runtimes, stop: threading.Event) -> None:
    """Follow every loaded task's checkpoints stream and hot-swap the newest checkpoint in."""
    seen: dict[str, str] = {}  # task -> last checkpoints-stream entry handled
    while not stop.is_set():
        streams: dict[KeyT, StreamIdT] = {
            checkpoints_key(name): seen.get(name, "0-0") for name in list(runtimes.loaded)
        }
        if not streams:
            stop.wait(0.2)
            continue
        try:
            batches = cast(StreamBatches, runtimes.specs.client.xread(streams, block=300))
        except redis.ConnectionError:
            stop.wait(1.0)  # Redis is away: keep serving what is loaded, retry
            continue
        for key, entries in batches:
            name = key.decode().split(":")[2]
            entry_id, fields = entries[-1]  # only the newest matters
            seen[name] = entry_id.decode()
            runtime = runtimes.loaded.get(name)
            if runtime is None:
                continue
            published = Published(**{k.decode(): v.decode() for k, v in fields.items()})
            try:
                runtime.adopt(published, runtimes.backbones.device)
            except Exception as error:  # a bad artifact is refused; the old version keeps serving
                runtime.record_refusal(published, error)
                logger.warning("task %s: refused checkpoint %s", name, runtime.swap_error)
