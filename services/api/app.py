"""`create_app()` wires the api: settings, lifespan, middleware, error handlers and the routers.

The routes (routes/*) are HTTP only; the work is in `serving/`, the engine (services/engine) and the
`openbook` library. State the routes share lives on `app.state` (settings, the Redis client, the task
runtimes and through them the specs, metrics, read/write threads, micro-batchers) and reaches them
through the dependencies in `deps.py`. Errors and their shapes: `errors.py`.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI

from services.api.api_workers import ApiWorkerSet
from services.api.console import mount_console
from services.api.errors import install_error_handlers
from services.api.metrics import Metrics
from services.api.middleware import LimitBody, MeasureLatency, NameWorker
from services.api.openapi import document_limits
from services.api.routes import ROUTERS
from services.api.serving.reports import Reports
from services.api.settings import Settings
from services.engine.backbones import Backbones
from services.engine.batching import Batchers
from services.engine.runtimes import Runtimes
from services.engine.specs import TaskSpecs
from services.engine.swap import follow_checkpoints
from services.engine.threads import ReadWriteThreads

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, api_workers: ApiWorkerSet | None = None) -> FastAPI:
    """`api_workers`: this app is one of several api workers behind one port (services/api/api_workers.py)."""
    settings = settings or Settings()
    metrics = Metrics(across_processes=api_workers is not None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _warn_if_open(settings)
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=10, health_check_interval=5)
        backbones = Backbones(
            max_length=settings.max_length,
            device=settings.device,
            default_backbone=settings.default_backbone,
            default_reader=settings.default_reader,
            model_dirs=settings.model_dirs,
            batch_size=settings.batch_max_texts,
            mixed_batches=settings.mixed_batches,
            compile=settings.compile,
        )
        runtimes = Runtimes(TaskSpecs(client, backbones))
        threads = ReadWriteThreads(reads=settings.read_threads, writes=settings.write_threads)
        batchers = Batchers(
            max_texts=settings.batch_max_texts,
            max_tokens=settings.batch_max_tokens,
            max_wait=settings.batch_max_wait_ms / 1000,
            max_delay=settings.batch_max_delay_ms / 1000,
            on_forward=metrics.forward_size.observe,
            offload=threads.read,
        )
        app.state.redis, app.state.runtimes = client, runtimes
        app.state.threads, app.state.batchers = threads, batchers
        app.state.reports = Reports()
        metrics.watch(runtimes, settings.artifacts)
        stop = threading.Event()
        follower = threading.Thread(target=follow_checkpoints, args=(runtimes, stop), daemon=True)
        follower.start()
        if api_workers is not None:
            api_workers.announce(ready=False)
        warmer = threading.Thread(target=_warm_up, args=(runtimes, stop, api_workers), daemon=True)
        warmer.start()
        yield
        if api_workers is not None:
            api_workers.leave()
        await app.state.reports.close()
        await batchers.close()
        stop.set()
        follower.join(timeout=5)
        warmer.join(timeout=5)  # it may be loading a model: it stops at its next Redis call, or quietly
        client.close()

    app = FastAPI(title="OpenBook", version="1", lifespan=lifespan)
    app.state.settings, app.state.metrics, app.state.api_workers = settings, metrics, api_workers
    # Not FastAPI's max_body_size: its 413 for a Content-Length over the limit is plain text, not an Error.
    app.add_middleware(LimitBody, max_bytes=settings.max_body_bytes)
    app.add_middleware(MeasureLatency, metrics=metrics)  # outermost (NameWorker aside): sees every answer
    if api_workers is not None:
        app.add_middleware(NameWorker)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    mount_console(app)  # after the API routes, so /v1, /docs and /openapi.json keep precedence
    app.state.routes = [route for router in ROUTERS for route in router.routes]  # for a 405's Allow
    document_limits(app, settings)
    return app


def _warm_up(runtimes: Runtimes, stop: threading.Event, api_workers: ApiWorkerSet | None) -> None:
    runtimes.warm_up(stop)
    if api_workers is not None and runtimes.warmed.is_set():
        api_workers.announce(ready=True)  # the other workers' /readyz count this one in


def _warn_if_open(settings: Settings) -> None:
    if settings.api_key is None and not _is_loopback(settings.host):
        logger.warning(
            "serving on %s with no write key (OPENBOOK_API_KEY): anyone who can reach it can create and "
            "delete tasks%s",
            settings.host,
            "" if settings.read_key else " and read every stored text",
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
