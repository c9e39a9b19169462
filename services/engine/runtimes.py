"""The replica's task runtimes: for each task it serves, a `TaskRuntime` (runtime.py) following its spec.

A runtime is built on first use, from the spec the task's `TaskSpecs` holds, on the replica's shared
backbones (backbones.py), and follows the spec as it changes: settings in place, labels grown or
fitted again, anything else a fresh runtime. A stored spec that no longer validates, or whose classifier
cannot be built, breaks its own task only: that task answers BrokenTask (and can be deleted), the
others and readiness carry on.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import redis
from openbook.artifacts import CheckpointError

from services.bus.examples_log import ExampleLog
from services.engine.runtime import TaskRuntime
from services.engine.specs import BrokenTask, InvalidSpec, TaskSpecs, read_spec
from services.engine.task_spec import SERVING, Task

logger = logging.getLogger(__name__)


# The parts of a spec that change without rebuilding the task's classifier (PATCH /v1/tasks/{task}).
IN_PLACE = ("training", *SERVING)


class Runtimes:
    """The runtimes of the tasks in `specs`, built on first use on `specs`' backbones, one per task."""

    def __init__(self, specs: TaskSpecs) -> None:
        self.specs = specs
        self.backbones = specs.backbones  # the ones the specs were checked on
        self.loaded: dict[str, TaskRuntime] = {}
        self.unbuildable: dict[str, str] = {}  # task -> why its classifier could not be built
        self._building = threading.Lock()  # guards building runtimes
        self.warmed = threading.Event()  # every task known at start-up is loaded and replayed

    def warm_up(self, stop: threading.Event) -> None:
        """Load every task and replay its log, so the first requests after a restart are served at once."""
        while not stop.is_set():
            try:
                for task in self.specs.all():
                    try:
                        runtime = self.runtime(task.name)
                        if runtime is not None:
                            runtime.catch_up()
                            runtime.key_book()
                    except (BrokenTask, ValueError) as error:  # e.g. a log entry the store cannot take
                        logger.warning("task %s not loaded: %s", task.name, error)  # the others are
            except redis.ConnectionError:
                stop.wait(1.0)  # Redis is not there yet: try again
                continue
            except Exception:
                if stop.is_set():
                    return  # the api is shutting down and closed the client under this thread
                raise
            self.warmed.set()
            return

    def catch_up_all(self) -> dict[str, str]:
        """Bring every loaded store level with its log; returns the tasks whose log could not be applied."""
        failed = {}
        for runtime in list(self.loaded.values()):
            try:
                runtime.catch_up(lambda_wait_s=0)  # a readiness probe answers at once; λ follows
            except ValueError as error:  # an entry the store cannot take (stored before it was refused)
                failed[runtime.task.name] = f"its log cannot be replayed: {error}"
        return failed

    def survey(self) -> tuple[list[Task], dict[str, str]]:
        """Every stored task whose spec reads, and every task this replica cannot serve, with why: its
        spec no longer reads (`TaskSpecs.survey`), or its classifier could not be built here."""
        tasks, broken = self.specs.survey()
        broken.update({t.name: self.unbuildable[t.name] for t in tasks if t.name in self.unbuildable})
        return tasks, broken

    def delete(self, name: str, artifacts_dir: Path) -> bool:
        """Delete the task everywhere (`TaskSpecs.delete`) and drop its runtime here; False if it was not."""
        removed = self.specs.delete(name, artifacts_dir)
        self.loaded.pop(name, None)
        self.unbuildable.pop(name, None)
        return removed

    def runtime(self, name: str) -> TaskRuntime | None:
        """The replica's runtime for a task, built on first use; the cached one while Redis is down.

        Raises BrokenTask when the stored spec no longer validates or its classifier cannot be built.
        """
        try:
            raw, generation = self.specs.current(name)
        except redis.ConnectionError:
            if name in self.loaded:
                return self.loaded[name]
            raise
        if raw is None:
            self.loaded.pop(name, None)
            return None
        task = read_spec(name, raw)
        runtime = self.loaded.get(name)
        if runtime is not None and runtime.generation != generation:
            runtime = None  # deleted and created again since: nothing of the old one may serve
        if runtime is not None and runtime.task != task and _differs_only_in(runtime.task, task, *IN_PLACE):
            runtime.take_settings(task)  # only settings that keep the served model changed
        if runtime is None or runtime.task != task:
            with self._building:  # concurrent first requests (and the warm-up) build one runtime, not several
                runtime = self.loaded.get(name)
                if runtime is not None and runtime.generation != generation:
                    runtime = None
                if runtime is None or runtime.task != task:
                    runtime = self._follow_spec(runtime, task, generation)
                    self.loaded[name] = runtime
        runtime.bind_spec(raw)
        return runtime

    def cached_runtime(self, name: str) -> TaskRuntime | None:
        """The runtime this replica last served the task with, if any, without asking Redis.

        Only for paths that end in `TaskRuntime.predict`, which checks under its lock, once per batch,
        that the task is still the one this runtime was built for (StaleRuntime if not); the lookup in
        `runtime` costs a Redis read and a hop to a worker thread on every request.
        """
        runtime = self.loaded.get(name)
        return runtime if runtime is not None and runtime.spec else None

    def _follow_spec(self, runtime: TaskRuntime | None, task: Task, generation: bytes) -> TaskRuntime:
        """The runtime for a spec that differs from the runtime's (or a first one); `_building` is held.

        Labels added (services/engine/labels.py): the classifier grows in place, keeping the served
        checkpoint and the store. Labels removed while a checkpoint is served: the checkpoint is
        adopted again, fitted to the labels left. Anything else: a fresh untrained runtime.
        """
        if runtime is not None and _differs_only_in(runtime.task, task, "labels", *IN_PLACE):
            try:
                if _extends(task.labels, runtime.task.labels):
                    runtime.grow_labels(task)
                    return runtime
                if runtime.published is not None:
                    runtime.readopt(task, self.backbones.device)
                    return runtime
            except (CheckpointError, OSError, ValueError) as error:  # served from scratch below
                logger.warning("task %s: its classifier cannot serve its labels: %s", task.name, error)
        try:
            classifier = self.specs.build(task)
        except InvalidSpec as error:
            self.unbuildable[task.name] = str(error)
            self.loaded.pop(task.name, None)
            raise BrokenTask(task.name, str(error)) from None
        self.unbuildable.pop(task.name, None)
        return TaskRuntime(
            task,
            classifier,
            ExampleLog(self.specs.client, task.name),
            backbone=self.backbones.backbone(task.backbone),
            generation=generation,
            mixer=self.backbones.mixer(task.backbone),
            prepare_backbone=self.backbones.prepare,
        )


def _differs_only_in(old: Task, new: Task, *fields: str) -> bool:
    """`old` and `new` are the same spec but for `fields` (a change there keeps the served model)."""
    return old.model_copy(update={name: getattr(new, name) for name in fields}) == new


def _extends(labels: dict[str, str], base: dict[str, str]) -> bool:
    """`labels` begins with `base`'s labels and words, in order (dicts compare equal in any order)."""
    return list(labels.items())[: len(base)] == list(base.items())
