"""`openbook serve`: the api (FastAPI under uvicorn), configured from `OPENBOOK_*`.

With `OPENBOOK_API_WORKERS` = N > 1 it runs N api processes behind one port, each a full replica
(services/api/api_workers.py). uvicorn binds the port here, once, and hands the socket to N spawned
workers; the kernel gives each new connection to one of them. uvicorn also restarts a worker that dies
or stops answering its health check, and stops them all on SIGTERM or SIGINT. Each worker builds its
app with `worker_app`, its settings from the environment it inherits. Why replicas and not one model
process fed by N HTTP processes: docs/benchmarks.md, "Several api processes behind one port".

With `OPENBOOK_FRONT_WORKERS` = F > 0 it runs F front processes on the port instead
(services/api/front.py), which gather single-text classify requests into requests of many texts, and
the replica (with its N workers) behind them on a loopback port of its own (`serve_behind_fronts`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli import fit_threads

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp
    from uvicorn.supervisors import Multiprocess

    from services.api.settings import Settings

# uvicorn kills a worker that does not answer its health check within this many seconds (its default is
# 5). A worker answers from a thread of its own, which waits for the GIL: a long call into a C extension
# holding it, say while a model loads on a busy machine, must not get a healthy worker killed.
HEALTHCHECK_TIMEOUT_S = 10


def run(args: argparse.Namespace) -> int:
    from services.api.settings import Settings

    settings = Settings()
    if settings.front_workers > 0:
        return serve_behind_fronts(settings)
    if settings.api_workers > 1:
        return serve_workers(settings)
    import uvicorn

    from services.api.app import create_app

    fit_threads(settings.threads)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    return 0


def serve_workers(settings: Settings) -> int:
    """`settings.api_workers` workers on one port until SIGTERM or SIGINT (0), or one fails to start (1)."""
    from uvicorn.config import STARTUP_FAILURE

    from services.api.api_workers import open_worker_set

    with tempfile.TemporaryDirectory(prefix="openbook-api-") as directory:
        os.environ.update(open_worker_set(Path(directory)))  # the workers inherit it
        supervisor = _supervise("worker_app", settings, settings.api_workers)
    return 1 if any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes) else 0


def _supervise(factory: str, settings: Settings, processes: int) -> Multiprocess:
    """`processes` processes on the port, each serving what this module's `factory` builds, until SIGTERM
    or SIGINT; uvicorn binds the port once and restarts a process that dies or stops answering."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(
        f"{__name__}:{factory}",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=processes,
        log_level="info",
        timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT_S,
    )
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    return supervisor


def serve_behind_fronts(settings: Settings) -> int:
    """`settings.front_workers` front processes on the port (services/api/front.py) before the replica,
    which is `openbook serve` again, as configured but for its address: a loopback port of its own. Ends
    when it is told to (SIGTERM, SIGINT) or when the replica ends; either way both go."""
    import subprocess
    import sys

    from services.bus.server import free_port

    internal = free_port()
    replica_env = {
        "OPENBOOK_FRONT_WORKERS": "0",
        "OPENBOOK_HOST": "127.0.0.1",
        "OPENBOOK_PORT": str(internal),
    }
    replica = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve"], env={**os.environ, **replica_env}
    )
    os.environ[FRONT_REPLICA] = f"http://127.0.0.1:{internal}"  # the fronts inherit it

    stopping = threading.Event()  # set once the fronts are stopped: the replica's end is then ours

    def stop_when_replica_ends() -> None:
        replica.wait()
        if not stopping.is_set():
            os.kill(os.getpid(), signal.SIGTERM)  # the supervisor stops the fronts

    threading.Thread(target=stop_when_replica_ends, name="replica-watch", daemon=True).start()
    try:
        _supervise("front_worker_app", settings, settings.front_workers)
    finally:
        stopping.set()
        if replica.poll() is None:
            replica.terminate()
            try:
                replica.wait(60)
            except subprocess.TimeoutExpired:
                replica.kill()
    return 0 if replica.returncode in (0, -signal.SIGTERM) else 1


# where `serve_behind_fronts` tells its fronts the replica answers
FRONT_REPLICA = "OPENBOOK_FRONT_REPLICA"


def front_worker_app() -> ASGIApp:
    """One front's app, built in the front process (uvicorn's factory), before the replica `serve` started."""
    from services.api.front import front_app
    from services.api.settings import Settings

    _stop_with_parent()
    settings = Settings()
    return front_app(
        os.environ[FRONT_REPLICA],
        max_body_bytes=settings.max_body_bytes,
        max_texts=settings.max_batch,
        max_wait=settings.front_max_wait_ms / 1000,
    )


def worker_app() -> FastAPI:
    """One worker's app, built in the worker (uvicorn's factory): settings from the inherited environment."""
    from services.api.api_workers import ApiWorkerSet
    from services.api.app import create_app
    from services.api.settings import Settings

    _stop_with_parent()
    settings = Settings()
    # The workers share the cores: each takes its part unless OPENBOOK_THREADS says otherwise.
    fit_threads(settings.threads or max(1, (os.cpu_count() or 1) // settings.api_workers))
    return create_app(settings, api_workers=ApiWorkerSet.from_environment(settings.api_workers))


def _stop_with_parent() -> None:
    """SIGTERM this worker when `serve` is gone, even killed outright: it must not hold the port alone."""
    parent = multiprocessing.parent_process()  # spawned by uvicorn: its sentinel closes when it dies
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
