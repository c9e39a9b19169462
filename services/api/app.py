"""`create_app()`: routes are HTTP only; the work is in `tasks.py` and the `openbook` library.

Errors are JSON `{"detail": ...}`: 404 for an unknown task or example, 409 for
a changed example id or task spec, 413 for a body over `max_body_bytes`, 422
for a body that does not fit the schema or the task (unknown label, batch or
text over the limits), 401/403 for a missing or wrong API key on a write, and
503 with Retry-After when Redis cannot take a write (classify keeps serving
from memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

import redis
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from openbook.methods import build_method
from openbook.prompting import PromptError
from openbook.training import TrainConfig
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.api import schemas
from services.api.batching import MicroBatcher
from services.api.console import mount_console
from services.api.deps import Registry, Runtime, Writer
from services.api.metrics import Metrics
from services.api.settings import Settings
from services.api.swap import follow_checkpoints
from services.api.tasks import TaskExists, TaskRegistry, TaskRuntime
from services.bus.examples_log import ConflictError, NewExample
from services.bus.jobs import JobQueue
from services.bus.workers import trainer_status


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=10, health_check_interval=5)
        registry = TaskRegistry(client, max_length=settings.max_length, device=settings.device)
        app.state.registry = registry
        metrics.watch(registry)
        stop = threading.Event()
        follower = threading.Thread(target=follow_checkpoints, args=(registry, stop), daemon=True)
        follower.start()
        threading.Thread(target=registry.warm_up, args=(stop,), daemon=True).start()
        yield
        for batcher in batchers.values():
            await batcher.close()
        stop.set()
        follower.join(timeout=5)
        client.close()

    app = FastAPI(title="OpenBook", version="1", lifespan=lifespan)
    app.state.settings = settings
    metrics = Metrics()
    batchers: dict[str, MicroBatcher] = {}
    retiring: set[asyncio.Task] = set()

    def batcher_for(runtime: TaskRuntime) -> MicroBatcher:
        batcher = batchers.get(runtime.task.name)
        if batcher is None or batcher.runtime is not runtime:  # a task re-created gets a new runtime
            if batcher is not None:  # the old one answers what it holds, then stops
                batcher.retire()
                retiring.add(batcher.consumer)  # asyncio keeps only weak references to tasks
                batcher.consumer.add_done_callback(retiring.discard)
            batcher = MicroBatcher(
                runtime,
                max_batch=settings.batch_max_texts,
                max_wait=settings.batch_max_wait_ms / 1000,
                max_delay=settings.batch_max_delay_ms / 1000,
                on_forward=metrics.forward_size.observe,
            )
            batchers[runtime.task.name] = batcher
        return batcher

    @app.middleware("http")
    async def measure(request: Request, call_next):
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.latency.labels(request.method, path, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and int(length) > settings.max_body_bytes:
            return JSONResponse(
                {"detail": f"body of {length} bytes is over the limit of {settings.max_body_bytes}"}, 413
            )
        return await call_next(request)

    @app.exception_handler(redis.ConnectionError)
    async def redis_down(request: Request, error: redis.ConnectionError) -> JSONResponse:
        return JSONResponse({"detail": f"the bus is unreachable: {error}"}, 503, headers={"Retry-After": "1"})

    def check_batch(count: int, texts: list[schemas.TextOrPair]) -> None:  # the limits are this app's
        if count > settings.max_batch:
            raise HTTPException(422, f"batch of {count} is over the limit of {settings.max_batch}")
        for i, text in enumerate(texts):
            if (
                sum(len(part) for part in ([text] if isinstance(text, str) else text))
                > settings.max_text_chars
            ):
                raise HTTPException(
                    422, f"text {i} is over the limit of {settings.max_text_chars} characters"
                )

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/livez")
    async def livez() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(registry: Registry) -> JSONResponse:
        """Ready: Redis answers, every task is loaded, and every store has caught up with its log."""
        if not registry.warmed.is_set():
            return JSONResponse(
                {"status": "not ready", "reason": "loading tasks and replaying their logs"}, 503
            )
        try:
            await asyncio.to_thread(registry.catch_up_all)
            training = await asyncio.to_thread(trainer_status, registry.client)
        except redis.ConnectionError as error:
            return JSONResponse({"status": "not ready", "reason": f"Redis unreachable: {error}"}, 503)
        return JSONResponse({"status": "ready", "tasks": len(registry.runtimes), **training})

    @app.post("/v1/tasks", status_code=201, dependencies=[Writer])
    async def create_task(body: schemas.TaskCreate, registry: Registry) -> schemas.Task:
        task = schemas.Task(**{**body.model_dump(), "backbone": body.backbone or settings.default_backbone})
        try:
            await asyncio.to_thread(registry.create, task)
        except PromptError as error:
            raise HTTPException(422, str(error)) from None
        except TaskExists as error:
            raise HTTPException(409, str(error)) from None
        return task

    @app.get("/v1/tasks")
    async def list_tasks(registry: Registry) -> list[schemas.Task]:
        return await asyncio.to_thread(registry.all)

    @app.get("/v1/tasks/{task}")
    async def get_task(runtime: Runtime) -> schemas.Task:
        return runtime.task

    @app.delete("/v1/tasks/{task}", status_code=204, dependencies=[Writer])
    async def delete_task(task: str, registry: Registry) -> None:
        if not await asyncio.to_thread(registry.delete, task, settings.artifacts):
            raise HTTPException(404, f"no task {task!r}")

    @app.post("/v1/tasks/{task}/examples", status_code=201, dependencies=[Writer])
    async def add_examples(body: schemas.ExamplesIn, runtime: Runtime) -> schemas.ExamplesAck:
        check_batch(len(body.examples), [e.text for e in body.examples])
        known = runtime.classifier.labels
        for i, example in enumerate(body.examples):
            if example.label not in known:
                raise HTTPException(
                    422, f"example {i}: unknown label {example.label!r}; labels: {list(known)}"
                )
            if isinstance(example.text, tuple) != runtime.classifier.template.is_pair:
                raise HTTPException(422, f"example {i}: this task takes {_shape(runtime)}")
        new = [NewExample(e.text, e.label, e.id) for e in body.examples]
        try:
            appended = await asyncio.to_thread(runtime.log.append, new)
        except ConflictError as error:
            raise HTTPException(409, str(error)) from None
        await asyncio.to_thread(runtime.catch_up)  # the next classify here already sees them
        return schemas.ExamplesAck(
            examples=[schemas.ExampleAck(id=a.id, created=a.offset is not None) for a in appended],
            store_version=runtime.offset,
        )

    @app.get("/v1/tasks/{task}/examples")
    async def list_examples(
        runtime: Runtime,
        after: Annotated[int, Query(ge=-1)] = -1,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> schemas.ExamplePage:
        await asyncio.to_thread(runtime.catch_up)
        ids = sorted(i for i in runtime.texts if i > after)
        page = ids[:limit]
        return schemas.ExamplePage(
            examples=[schemas.Example(id=i, text=runtime.texts[i], label=runtime.labels[i]) for i in page],
            next_after=page[-1] if len(ids) > limit else None,
        )

    @app.delete("/v1/tasks/{task}/examples/{example_id}", status_code=204, dependencies=[Writer])
    async def delete_example(example_id: int, runtime: Runtime) -> None:
        if not await asyncio.to_thread(runtime.log.delete, example_id):
            raise HTTPException(404, f"no example {example_id} in task {runtime.task.name!r}")
        await asyncio.to_thread(runtime.catch_up)

    @app.post("/v1/tasks/{task}/classify")
    async def classify(body: schemas.ClassifyIn, runtime: Runtime) -> schemas.ClassifyOut:
        check_batch(len(body.texts), body.texts)
        metrics.batch_size.observe(len(body.texts))
        for i, text in enumerate(body.texts):
            if isinstance(text, tuple) != runtime.classifier.template.is_pair:
                raise HTTPException(422, f"text {i}: this task takes {_shape(runtime)}")
        # The batch catches up with the log once before its forward (TaskRuntime.predict).
        predictions, model_version, store_version = await batcher_for(runtime).predict(body.texts)
        return schemas.ClassifyOut(
            predictions=[_prediction(p, runtime, body.neighbours) for p in predictions],
            model_version=model_version,
            store_version=store_version,
        )

    @app.post("/v1/tasks/{task}/demonstrations")
    async def demonstrations(body: schemas.DemonstrationsIn, runtime: Runtime) -> schemas.DemonstrationsOut:
        check_batch(1, [body.text])
        with contextlib.suppress(redis.ConnectionError):
            await asyncio.to_thread(runtime.catch_up)
        demos = await asyncio.to_thread(runtime.demonstrations, body.text)
        classes = []
        for c, label in enumerate(runtime.classifier.labels):
            present = demos.ids[0, c] >= 0
            classes.append(
                schemas.ClassDemonstration(
                    label=label,
                    neighbours=[
                        schemas.DemoNeighbour(
                            id=int(i), text=runtime.texts.get(int(i)), similarity=float(s), weight=float(w)
                        )
                        for i, s, w in zip(
                            demos.ids[0, c][present],
                            demos.similarities[0, c][present],
                            demos.weights[0, c][present],
                            strict=True,
                        )
                    ],
                )
            )
        return schemas.DemonstrationsOut(
            demonstrations=classes, model_version=runtime.model_version, store_version=runtime.offset
        )

    @app.post("/v1/tasks/{task}/train", status_code=202, dependencies=[Writer])
    async def start_training(body: schemas.TrainIn, runtime: Runtime, registry: Registry) -> schemas.JobOut:
        method = body.method or runtime.task.method
        config = body.model_dump(exclude={"method"})
        try:
            build_method(method).check_backbone(runtime.classifier.backbone)
            TrainConfig(**config)
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        queue = JobQueue(registry.client)
        job_id = await asyncio.to_thread(queue.submit, runtime.task.name, method, config)
        metrics.jobs.labels(runtime.task.name).inc()
        return schemas.JobOut.model_validate(await asyncio.to_thread(queue.get, job_id))

    @app.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str, registry: Registry) -> schemas.JobOut:
        record = await asyncio.to_thread(JobQueue(registry.client).get, job_id)
        if record is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return schemas.JobOut.model_validate(record)

    mount_console(app)
    return app


def _shape(runtime: TaskRuntime) -> str:
    return "pairs [text_a, text_b]" if runtime.classifier.template.is_pair else "single texts"


def _prediction(prediction, runtime: TaskRuntime, with_neighbours: bool) -> schemas.PredictionOut:
    neighbours = None
    if with_neighbours:
        neighbours = [
            schemas.NeighbourOut(
                id=n.id, text=runtime.texts.get(n.id), label=n.label, similarity=n.similarity
            )
            for n in prediction.neighbours
        ]
    return schemas.PredictionOut(
        label=prediction.label,
        probabilities=prediction.probabilities,
        p_lm=prediction.p_lm,
        p_knn=prediction.p_knn,
        neighbours=neighbours,
        truncated=prediction.truncated,
    )
