"""`openbook serve`: the api (FastAPI under uvicorn), configured from `OPENBOOK_*`.

With `OPENBOOK_API_WORKERS` = N > 1 it runs N api processes behind one port, each a full replica
(services/api/api_workers.py). uvicorn binds the port here, once, and hands the socket to N spawned
workers; the kernel gives each new connection to one of them. uvicorn also restarts a worker that dies
or stops answering its health check, and stops them all on SIGTERM or SIGINT. Each worker builds its
app with `worker_app`, its settings from the environment it inherits. Why replicas and not one model
process fed by N HTTP processes: docs/benchmarks.md, "Several api processes behind one port".
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

    from services.api.settings import Settings

# uvicorn kills a worker that does not answer its health check within this many seconds (its default is
# 5). A worker answers from a thread of its own, which waits for the GIL: a long call into a C extension
# holding it, say while a model loads on a busy machine, must not get a healthy worker killed.
HEALTHCHECK_TIMEOUT_S = 10


def run(args: argparse.Namespace) -> int:
    from services.api.settings import Settings

    settings = Settings()
    if settings.api_workers > 1:
        return serve_workers(settings)
    import uvicorn

    from services.api.app import create_app

    fit_threads(settings.threads)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
    return 0


def serve_workers(settings: Settings) -> int:
    """`settings.api_workers` workers on one port until SIGTERM or SIGINT (0), or one fails to start (1)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from services.api.api_workers import open_worker_set

    with tempfile.TemporaryDirectory(prefix="openbook-api-") as directory:
        os.environ.update(open_worker_set(Path(directory)))  # the workers inherit it
        config = uvicorn.Config(
            f"{__name__}:worker_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.api_workers,
            log_level="info",
            timeout_worker_healthcheck=HEALTHCHECK_TIMEOUT_S,
        )
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
    return 1 if any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes) else 0


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
