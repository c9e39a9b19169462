"""Task specs: stored in one Redis hash (services/bus/keys.py), read and written as `Task`s.

Only a spec that can be served is stored: `create` and `update_training` check it in full first, on the
replica's backbones (`build`). A stored spec that no longer validates (an older or newer version wrote
it) breaks its own task only: reading it raises BrokenTask, which that task answers, and it can be
deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import redis
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods import build_method, check_prompt_fits
from openbook.prompting import PromptError, Template, Verbalizer
from pydantic import ValidationError

from services.bus.deletion import delete_task
from services.bus.keys import GENERATIONS_KEY, TASKS_KEY
from services.bus.replies import Fields
from services.engine.autotrain import update_training
from services.engine.backbones import Backbones, UnknownBackbone
from services.engine.task_spec import BadTraining, Task, check_training, task_classifier, task_reader


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


class TaskSpecs:
    """The task specs in Redis, each checked against `backbones` before it is stored."""

    def __init__(self, client: redis.Redis, backbones: Backbones) -> None:
        self.client = client
        self.backbones = backbones

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
        try:
            self.backbones.check_name(task.backbone)
        except UnknownBackbone as error:
            raise InvalidSpec("backbone", str(error)) from None
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
            backbone = self.backbones.backbone(task.backbone)
        except (OSError, ValueError) as error:  # missing files; a config transformers cannot read
            raise InvalidSpec("backbone", f"backbone {task.backbone!r} cannot be loaded: {error}") from None
        if task.reader is not None:
            try:
                self.backbones.check_reader(task.reader)
                task_reader(task, str(backbone.device))
            except UnknownBackbone as error:
                raise InvalidSpec("reader", str(error)) from None
            except (OSError, ValueError) as error:  # missing files; not a model a reader can cut
                raise InvalidSpec("reader", f"reader {task.reader!r} cannot be loaded: {error}") from None
        try:
            method.check_backbone(backbone)
            classifier = task_classifier(task, backbone)
            check_prompt_fits(backbone, classifier.template, classifier.verbalizer, method)  # demos too
        except ValueError as error:
            raise InvalidSpec("", str(error)) from None
        self._check_training(task, backbone)
        if self.backbones.batch_size is not None:
            classifier.batch_size = self.backbones.batch_size
        return classifier

    def _check_training(self, task: Task, backbone: Backbone) -> None:
        try:
            check_training(task.training, task.method, backbone)
        except BadTraining as error:
            raise InvalidSpec(f"training.{error.field}".rstrip("."), str(error)) from None

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

    def update_training(
        self, name: str, changes: dict[str, Any], serving: dict[str, Any] | None = None
    ) -> Task | None:
        """Merge `changes` over the task's training settings, set the `serving` settings (min_confidence),
        and store them; None when there is no task.

        InvalidSpec (nothing written) when the settings cannot train the task; SpecChanged when the task
        kept changing meanwhile. The task's replicas take the new settings in place (runtimes.py).
        """
        return update_training(
            self.client,
            name,
            changes,
            lambda task: self._check_training(task, self.backbones.backbone(task.backbone)),
            serving=serving,
        )

    def stored(self, name: str) -> tuple[bytes, Task] | None:
        """The task's spec as Redis holds it (for a compare-and-set) and as a Task; BrokenTask if the
        stored spec no longer validates."""
        raw = cast("bytes | None", self.client.hget(TASKS_KEY, name))  # see services/bus/replies.py
        return None if raw is None else (raw, read_spec(name, raw))

    def get(self, name: str) -> Task | None:
        """The task's spec; BrokenTask if the stored spec no longer validates."""
        stored = self.stored(name)
        return None if stored is None else stored[1]

    def current(self, name: str) -> tuple[bytes | None, bytes]:
        """The task's spec as Redis holds it (None: no such task) and its generation, in one round trip.

        The generation counts the deletes of tasks of this name: a task deleted and created again under
        the same spec is another task."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(TASKS_KEY, name)
        pipe.hget(GENERATIONS_KEY, name)
        raw, generation = pipe.execute()
        return raw, generation or b"0"

    def survey(self) -> tuple[list[Task], dict[str, str]]:
        """Every stored task whose spec reads, and every stored spec that no longer does, with why."""
        tasks, broken = [], {}
        for raw_name, raw in sorted(cast(Fields, self.client.hgetall(TASKS_KEY)).items()):
            name = raw_name.decode()
            try:
                tasks.append(read_spec(name, raw))
            except BrokenTask as error:
                broken[name] = error.reason
        return tasks, broken

    def all(self) -> list[Task]:
        """The stored tasks whose specs read (a broken one is left out: see `survey`)."""
        return self.survey()[0]

    def delete(self, name: str, artifacts_dir: Path) -> bool:
        """Delete the task and everything it owned (its log, jobs, versions, artifacts on disk); False if
        there was nothing of it."""
        return bool(delete_task(self.client, name, artifacts_dir))


def read_spec(name: str, raw: bytes) -> Task:
    """Task `name`'s spec as Redis holds it (`raw`), read as a Task; BrokenTask if it no longer validates."""
    try:
        return Task.model_validate_json(raw)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise BrokenTask(name, problems) from None
