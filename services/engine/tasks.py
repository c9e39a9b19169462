"""Tasks as the api holds them: specs in Redis, and per replica a runtime for each task it serves.

`TaskRegistry` validates, creates, reads and deletes specs, builds a task's classifier on first use
(one backbone per name, shared by the tasks whose methods keep it frozen) and keeps each task's
`TaskRuntime` (runtime.py) following its spec.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import redis
from openbook.artifacts import CheckpointError
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.methods import build_method, check_prompt_fits
from openbook.mixed import MixedForward
from openbook.models import DEFAULT_BACKBONE, PACKAGED_MODELS, model_cache_dir
from openbook.prompting import PromptError, Template, Verbalizer
from pydantic import ValidationError

from services.bus.deletion import delete_task
from services.bus.examples_log import ExampleLog
from services.bus.keys import GENERATIONS_KEY, TASKS_KEY
from services.bus.replies import Fields
from services.engine.autotrain import update_training
from services.engine.runtime import TaskRuntime
from services.engine.task_spec import BadTraining, Task, check_training, task_classifier

logger = logging.getLogger(__name__)


# The parts of a spec that change without rebuilding the task's classifier (PATCH /v1/tasks/{task}).
IN_PLACE = ("training", "min_confidence")


class TaskExists(ValueError):
    pass


class InvalidSpec(ValueError):
    """A task spec that cannot be served; `field` is the part of the spec at fault ("" for their mix)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class BrokenTask(Exception):
    """A stored task that cannot be served: its spec no longer validates, or no classifier can be built."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(
            f"task {name!r} is stored but no longer valid ({reason}); delete it and create it again"
        )
        self.name = name
        self.reason = reason


class TaskRegistry:
    """Task specs in one Redis hash; classifiers built on first use, one backbone per name.

    A stored spec that no longer validates, or whose classifier cannot be built, breaks its own task
    only: that task answers BrokenTask (and can be deleted), the others and readiness carry on.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        max_length: int,
        device: str,
        default_backbone: str = DEFAULT_BACKBONE,
        model_dirs: Sequence[Path] = (),
        batch_size: int | None = None,
        mixed_batches: bool = True,  # LoRA tasks on one backbone may share a forward (openbook.mixed)
        compile: bool = False,  # compile each backbone loaded (openbook.compiled), off the request path
    ) -> None:
        self.client = client
        self.mixed_batches = mixed_batches
        self.compile = compile
        # Texts per forward in a task's classifier (None: the library's default). The micro-batcher
        # already bounds a forward (OPENBOOK_BATCH_MAX_TEXTS, 1024 on CUDA); a smaller chunk here would
        # cut each of its batches into several forwards again.
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.default_backbone = default_backbone
        self.model_dirs = [model_cache_dir(), *model_dirs]
        self.runtimes: dict[str, TaskRuntime] = {}
        self.unbuildable: dict[str, str] = {}  # task -> why its classifier could not be built
        self._backbones: dict[str, Backbone] = {}
        self._mixers: dict[str, MixedForward] = {}  # one per backbone, for its LoRA tasks' mixed batches
        self._lock = threading.Lock()  # guards _backbones and _mixers
        self._building = threading.Lock()  # guards building runtimes
        self.warmed = threading.Event()  # every task known at start-up is loaded and replayed

    def warm_up(self, stop: threading.Event) -> None:
        """Load every task and replay its log, so the first requests after a restart are served at once."""
        while not stop.is_set():
            try:
                for task in self.all():
                    try:
                        runtime = self.runtime(task.name)
                        if runtime is not None:
                            runtime.catch_up()
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
        for runtime in list(self.runtimes.values()):
            try:
                runtime.catch_up(lambda_wait_s=0)  # a readiness probe answers at once; λ follows
            except ValueError as error:  # an entry the store cannot take (stored before it was refused)
                failed[runtime.task.name] = f"its log cannot be replayed: {error}"
        return failed

    def check_backbone(self, name: str) -> None:
        """Raise InvalidSpec unless `name` is a backbone this service may load without reaching out.

        That is a registered backbone (openbook.models), the service's default, or a model directory
        (with a config.json) under the model cache or `model_dirs`. Anything else would be looked up on a
        model hub, which takes long offline and lets a client make the server fetch models; and a path
        outside those directories lets a client probe the server's files.
        """
        if name in PACKAGED_MODELS or name == self.default_backbone:
            return
        path = Path(name)
        if path.is_absolute():
            resolved = path.resolve()
            for root in self.model_dirs:
                if resolved.is_relative_to(root.resolve()) and (resolved / "config.json").is_file():
                    return
        known = ", ".join(sorted({*PACKAGED_MODELS, self.default_backbone}))
        where = ", ".join(str(d) for d in self.model_dirs)
        raise InvalidSpec(
            "backbone",
            f"unknown backbone {name!r}: use one of {known}, or the path of a model directory under {where}",
        )

    def backbone(self, name: str) -> Backbone:
        with self._lock:
            if name not in self._backbones:
                config = BackboneConfig(name=name, max_length=self.max_length, device=self.device)
                self._backbones[name] = self.prepare(load_backbone(config))
            return self._backbones[name]

    def prepare(self, backbone: Backbone) -> Backbone:
        """A newly loaded backbone, compiled for the replica's batches if the settings say so."""
        if self.compile:
            backbone.compile(max_rows=self.batch_size or Classifier.batch_size)
        return backbone

    def mixer(self, name: str) -> MixedForward | None:
        """The mixed-batch forward of backbone `name` (None when mixed batches are off)."""
        if not self.mixed_batches:
            return None
        backbone = self.backbone(name)
        with self._lock:
            if name not in self._mixers:
                self._mixers[name] = MixedForward(backbone)
            return self._mixers[name]

    def build(self, task: Task) -> Classifier:
        """The task's untrained classifier, after every check a spec must pass; raises InvalidSpec.

        Each part is checked on its own first, so that the error names the field at fault; then
        together, on the backbone's tokenizer (a causal model needs the slot last, label words must
        tokenize, the template must leave room for the text).
        """
        try:  # what is stored must read back as the same spec (a float that is not finite would not)
            if Task.model_validate_json(task.model_dump_json()) != task:
                raise ValueError("it reads back as another spec")
        except ValueError as error:
            raise InvalidSpec("", f"the spec cannot be stored: {error}") from None
        self.check_backbone(task.backbone)
        try:
            Template(task.template)
        except PromptError as error:
            raise InvalidSpec("template", str(error)) from None
        try:
            Verbalizer(tuple(task.labels), tuple(task.labels.values()))
        except PromptError as error:
            raise InvalidSpec("labels", str(error)) from None
        try:
            method = build_method(task.method)
        except ValueError as error:
            raise InvalidSpec("method", str(error)) from None
        try:
            backbone = self.backbone(task.backbone)
        except (OSError, ValueError) as error:  # missing files; a config transformers cannot read
            raise InvalidSpec("backbone", f"backbone {task.backbone!r} cannot be loaded: {error}") from None
        try:
            method.check_backbone(backbone)
            classifier = task_classifier(task, backbone)
            check_prompt_fits(backbone, classifier.template, classifier.verbalizer, method)  # demos too
        except ValueError as error:
            raise InvalidSpec("", str(error)) from None
        self._check_training(task, backbone)
        if self.batch_size is not None:
            classifier.batch_size = self.batch_size
        return classifier

    def _check_training(self, task: Task, backbone: Backbone) -> None:
        try:
            check_training(task.training, task.method, backbone)
        except BadTraining as error:
            raise InvalidSpec(f"training.{error.field}".rstrip("."), str(error)) from None

    def update_training(
        self, name: str, changes: dict[str, Any], serving: dict[str, Any] | None = None
    ) -> Task | None:
        """Merge `changes` over the task's training settings, set the `serving` settings (min_confidence),
        and store them; None when there is no task.

        InvalidSpec (nothing written) when the settings cannot train the task; SpecChanged when the task
        kept changing meanwhile. The task's replicas take the new settings in place (`runtime`).
        """
        return update_training(
            self.client,
            name,
            changes,
            lambda task: self._check_training(task, self.backbone(task.backbone)),
            serving=serving,
        )

    def create(self, task: Task) -> bool:
        """Store a new task (False if the same spec exists); a different spec under the name raises.

        The spec is checked in full first (InvalidSpec), so only specs that can be served are stored.
        """
        self.build(task)
        spec = task.model_dump_json()
        if not self.client.hsetnx(TASKS_KEY, task.name, spec):
            existing = self.client.hget(TASKS_KEY, task.name)
            if existing is not None:
                try:
                    same = Task.model_validate_json(existing) == task
                except ValidationError:
                    raise TaskExists(
                        f"task {task.name!r} is stored with a spec that is no longer valid; delete it first"
                    ) from None
                if not same:
                    raise TaskExists(f"task {task.name!r} exists with another spec")
            return False
        return True

    def get(self, name: str) -> Task | None:
        """The task's spec; BrokenTask if the stored spec no longer validates."""
        raw = cast("bytes | None", self.client.hget(TASKS_KEY, name))  # see services/bus/replies.py
        return None if raw is None else read_spec(name, raw)

    def survey(self) -> tuple[list[Task], dict[str, str]]:
        """Every stored task whose spec reads, and every task that cannot be served, with why."""
        tasks, broken = [], {}
        for raw_name, raw in sorted(cast(Fields, self.client.hgetall(TASKS_KEY)).items()):
            name = raw_name.decode()
            try:
                tasks.append(read_spec(name, raw))
            except BrokenTask as error:
                broken[name] = error.reason
        broken.update({t.name: self.unbuildable[t.name] for t in tasks if t.name in self.unbuildable})
        return tasks, broken

    def all(self) -> list[Task]:
        """The stored tasks whose specs read (a broken one is left out: see `survey`)."""
        return self.survey()[0]

    def delete(self, name: str, artifacts_dir: Path) -> bool:
        removed = delete_task(self.client, name, artifacts_dir)  # everything the task owned, disk included
        self.runtimes.pop(name, None)
        self.unbuildable.pop(name, None)
        return bool(removed)

    def runtime(self, name: str) -> TaskRuntime | None:
        """The replica's classifier for a task, built on first use; the cached one while Redis is down.

        Raises BrokenTask when the stored spec no longer validates or its classifier cannot be built.
        """
        try:
            pipe = self.client.pipeline(transaction=False)  # one round trip
            pipe.hget(TASKS_KEY, name)
            pipe.hget(GENERATIONS_KEY, name)
            raw, generation = pipe.execute()
        except redis.ConnectionError:
            if name in self.runtimes:
                return self.runtimes[name]
            raise
        if raw is None:
            self.runtimes.pop(name, None)
            return None
        task, generation = read_spec(name, raw), generation or b"0"
        runtime = self.runtimes.get(name)
        if runtime is not None and runtime.generation != generation:
            runtime = None  # deleted and created again since: nothing of the old one may serve
        if runtime is not None and runtime.task != task and _differs_only_in(runtime.task, task, *IN_PLACE):
            runtime.take_settings(task)  # only settings that keep the served model changed
        if runtime is None or runtime.task != task:
            with self._building:  # concurrent first requests (and the warm-up) build one runtime, not several
                runtime = self.runtimes.get(name)
                if runtime is not None and runtime.generation != generation:
                    runtime = None
                if runtime is None or runtime.task != task:
                    runtime = self._follow_spec(runtime, task, generation)
                    self.runtimes[name] = runtime
        runtime.bind_spec(raw)
        return runtime

    def cached_runtime(self, name: str) -> TaskRuntime | None:
        """The runtime this replica last served the task with, if any, without asking Redis.

        Only for paths that end in `TaskRuntime.predict`, which checks under its lock, once per batch,
        that the task is still the one this runtime was built for (StaleRuntime if not); the lookup in
        `runtime` costs a Redis read and a hop to a worker thread on every request.
        """
        runtime = self.runtimes.get(name)
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
                    runtime.readopt(task, self.device)
                    return runtime
            except (CheckpointError, OSError, ValueError) as error:  # served from scratch below
                logger.warning("task %s: its classifier cannot serve its labels: %s", task.name, error)
        try:
            classifier = self.build(task)
        except InvalidSpec as error:
            self.unbuildable[task.name] = str(error)
            self.runtimes.pop(task.name, None)
            raise BrokenTask(task.name, str(error)) from None
        self.unbuildable.pop(task.name, None)
        backbone = self.backbone(task.backbone)
        log = ExampleLog(self.client, task.name)
        return TaskRuntime(
            task,
            classifier,
            log,
            backbone=backbone,
            generation=generation,
            mixer=self.mixer(task.backbone),
            prepare_backbone=self.prepare,
        )


def _differs_only_in(old: Task, new: Task, *fields: str) -> bool:
    """`old` and `new` are the same spec but for `fields` (a change there keeps the served model)."""
    return old.model_copy(update={name: getattr(new, name) for name in fields}) == new


def _extends(labels: dict[str, str], base: dict[str, str]) -> bool:
    """`labels` begins with `base`'s labels and words, in order (dicts compare equal in any order)."""
    return list(labels.items())[: len(base)] == list(base.items())


def read_spec(name: str, raw: bytes) -> Task:
    try:
        return Task.model_validate_json(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise BrokenTask(name, problems) from None
