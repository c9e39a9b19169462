"""`openbook up`: the whole stack on one machine, supervised.

Without a Redis URL (`OPENBOOK_REDIS_URL` or `REDIS_URL`) it starts the
embedded server (AOF on, under `OPENBOOK_DATA_DIR/redis`), then the api and
the trainer, each a child process restarted when it dies (supervisor.py).
A restarted server replays its AOF on the same port, so every acknowledged
write is back and the others reconnect; a dead worker's jobs are queued
again as soon as its death is seen. A lock on `OPENBOOK_DATA_DIR/openbook.lock`
keeps a second stack off the same data (two servers appending to one AOF
would ruin it); the children inherit it, so it is held until the last of
them exits. SIGINT or SIGTERM stops the api and the trainer together, then the server: each gets
SIGTERM and, if it is still there after its grace (`STOP_GRACE_S`), SIGKILL with all it started (its
process group), so a stop takes at most 8 s whatever they are doing (a long forward, a training job),
within the 10 s a container runtime waits before it kills (`docker stop`).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from services.bus.server import EmbeddedRedis
from services.cli.supervisor import Child, RestartPolicy, Supervisor

LOCK_NAME = "openbook.lock"
# SIGTERM to SIGKILL. The api answers what it can in its part (serve.py) and the trainer stops between jobs;
# what is acknowledged is on disk already (AOF always), so a kill loses nothing acknowledged. The server
# flushes its AOF and exits within a fraction of a second.
STOP_GRACE_S = {"api": 5.0, "worker": 5.0, "valkey": 3.0}
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class DataDirBusy(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"openbook up: {message}", flush=True)


def lock_data_dir(data_dir: Path) -> int:
    """An exclusive lock on the data directory, as an open descriptor; DataDirBusy if a stack holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 64).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise DataDirBusy(
            f"another openbook stack is running on {data_dir} ({path} is held by pid {holder} or the "
            "processes it started); stop it first, or give this one another OPENBOOK_DATA_DIR"
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    return descriptor


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # `up` killed outright takes its children along


def child_options(lock: int) -> dict[str, Any]:
    """How every child is started: holding the data directory's lock, in a session of its own (a Ctrl-C
    reaches only `up`, which stops the children in order) and ended if `up` itself is killed."""
    return {"pass_fds": (lock,), "start_new_session": True, "preexec_fn": _die_with_parent}


def valkey_child(server: EmbeddedRedis) -> Child:
    """The embedded server as a child: restarted on its port and AOF, its log's warnings said at its death."""

    def start() -> subprocess.Popen:
        server.start(timeout=120)  # a large AOF takes a while to load
        assert server.process is not None
        return server.process

    return Child(
        "valkey",
        start=start,
        last_words=lambda: " / ".join(server.warnings()),
        stop_timeout_s=STOP_GRACE_S["valkey"],
    )


def run(args: argparse.Namespace) -> int:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from services.api.settings import Settings
    from services.bus.workers import worker_died

    settings = Settings()
    try:
        lock = lock_data_dir(settings.data_dir)
    except DataDirBusy as busy:
        say(str(busy))
        return 1
    options = child_options(lock)
    env = dict(os.environ)
    children = []
    if not (os.environ.get("OPENBOOK_REDIS_URL") or os.environ.get("REDIS_URL")):
        server = EmbeddedRedis(settings.data_dir / "redis", **options)
        env["OPENBOOK_REDIS_URL"] = server.url
        children.append(valkey_child(server))
        say(f"embedded Redis (AOF always) on {server.url}, data in {settings.data_dir}")
    url = env.get("OPENBOOK_REDIS_URL") or settings.redis_url

    def requeue_jobs_of_worker(cause: str) -> None:
        # Fail fast while Redis is away too: the worker takes its own jobs back when it restarts.
        client = redis.Redis.from_url(url, socket_timeout=2, retry=Retry(NoBackoff(), 0))
        try:
            released = worker_died(client, settings.worker_name, f"its worker {cause}; queued again")
        except redis.RedisError as error:
            say(f"could not queue {settings.worker_name}'s jobs again now ({error}); it will on its restart")
            return
        finally:
            client.close()
        if released:
            say(f"queued again at once: job(s) {', '.join(released)} of the dead worker")

    def service(command: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "services.cli", command], env=env, **options)

    children.append(Child("api", start=lambda: service("serve"), stop_timeout_s=STOP_GRACE_S["api"]))
    children.append(
        Child(
            "worker",
            start=lambda: service("worker"),
            on_death=requeue_jobs_of_worker,
            stop_timeout_s=STOP_GRACE_S["worker"],
        )
    )
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    if args.demo:
        base = f"http://{settings.host}:{settings.port}"
        threading.Thread(target=_seed_demo, args=(base, stopping), daemon=True).start()
    policy = RestartPolicy(settings.restart_limit, settings.restart_window_s, settings.restart_backoff_s)
    code = Supervisor(children, policy, log=say).run(stopping)
    say("stopped" if code == 0 else "stopped, having given up on a crash loop")
    return code


# The demo task trains by itself, as every task does by default: a job once its 8 examples are in, then
# one per 8 more. A short one: a RetroPrompt step of 8 texts takes about 2 s on a 2-core CPU
# (docs/benchmarks.md), so 16 steps of 4 and the store's re-embedding finish well within two minutes.
DEMO_TRAINING = {"every": 8, "steps": 16, "batch_size": 4, "eval_every": 8}


def _seed_demo(base: str, stopping: threading.Event) -> None:
    """Once the api is ready, create the `sentiment` task with the examples in examples/sentiment.tsv."""
    from openbook.data import read_split

    from services.api.schemas import ExampleIn
    from services.client import OpenBookClient, OpenBookError, wait_ready

    if not wait_ready(base, timeout=600, alive=lambda: not stopping.is_set()):
        return
    with OpenBookClient(base, api_key=os.environ.get("OPENBOOK_API_KEY"), timeout=300) as client:
        try:
            client.create_task(
                "sentiment",
                "Review: {text}\nSentiment: {mask}",
                {"0": "negative", "1": "positive"},
                training=DEMO_TRAINING,
            )
        except OpenBookError as error:
            if error.status != 409:
                raise
            say("the demo task 'sentiment' exists with other settings (changed since?): left as it is")
        examples = [
            ExampleIn(text=e.text, label=e.label, id=i)
            for i, e in enumerate(read_split("examples/sentiment.tsv"))
        ]
        client.add_examples("sentiment", examples)
    say(f"demo task 'sentiment' ready with {len(examples)} examples at {base}; it trains by itself")
