"""Adding a label to a live task, and removing one that nothing depends on (routes/labels.py).

A label added is served at once: the stored spec grows (services/bus/task_labels.py), and each
replica, on its next request for the task, grows its classifier in place (TaskRegistry.runtime):
the served checkpoint and the store stay, the LM scores the new label by its word, and its examples
enter the store as they come. The next training trains the label like any other.

A label is removed only if no current example uses it and the served checkpoint was not trained
with it: such a checkpoint's head has the label's row, and serving it without the label would be
another model. A label added since the served checkpoint, with no examples yet, can go.
"""

from __future__ import annotations

from typing import cast

from openbook.labels import LabelError, add_label

from services.api.tasks import TaskRegistry, read_spec
from services.bus.task_labels import served_labels, swap_spec
from services.bus.task_spec import TASKS_KEY, Task

ATTEMPTS = 8  # concurrent changes of one task's spec are rare; each retry decides again


class NoSuchTask(LookupError):
    pass


class NoSuchLabel(LookupError):
    pass


class LabelConflict(ValueError):
    """The change conflicts with what is stored: the label exists, is in use, or is the last but one."""


class BadWord(ValueError):
    """The task's backbone and prompt cannot score the word."""


class SpecBusy(RuntimeError):
    """The spec kept changing under the change: try again."""


def add_task_label(registry: TaskRegistry, name: str, label: str, word: str) -> Task:
    """Add `label`, scored by `word`, to task `name`; returns the stored spec (blocking)."""
    for _ in range(ATTEMPTS):
        raw, task = _stored(registry, name)
        if label in task.labels:
            raise LabelConflict(f"task {name!r} has label {label!r} already (word {task.labels[label]!r})")
        runtime = registry.runtime(name)  # level with the spec: its classifier has the labels read above
        if runtime is None:
            raise NoSuchTask(name)
        try:  # the word checked on the classifier that will serve it, before anything is written
            add_label(runtime.classifier, label, word)
        except LabelError as error:
            raise BadWord(str(error)) from None
        grown = task.model_copy(update={"labels": {**task.labels, label: word}})
        if swap_spec(registry.client, raw, grown):
            registry.runtime(name)  # this replica follows at once: the label's examples are taken now
            return grown
    raise SpecBusy(f"the spec of task {name!r} kept changing; try again")


def remove_task_label(registry: TaskRegistry, name: str, label: str) -> Task:
    """Remove `label` from task `name` if nothing depends on it; returns the stored spec (blocking)."""
    for _ in range(ATTEMPTS):
        raw, task = _stored(registry, name)
        if label not in task.labels:
            raise NoSuchLabel(f"task {name!r} has no label {label!r}; labels: {list(task.labels)}")
        if len(task.labels) <= 2:
            raise LabelConflict(f"task {name!r} would be left with fewer than 2 labels")
        try:
            version, trained = served_labels(registry.client, name)
        except (OSError, ValueError, KeyError) as error:
            raise LabelConflict(f"the served checkpoint's labels cannot be read: {error}") from None
        if label in trained:
            raise LabelConflict(
                f"the served checkpoint {version} was trained with label {label!r}: its head scores "
                "the label, so the label stays while a checkpoint trained with it is served"
            )
        runtime = registry.runtime(name)
        if runtime is None:
            raise NoSuchTask(name)
        runtime.catch_up()
        with runtime.lock:  # the offset and the examples it covers, read together
            offset = runtime.offset
            used = sum(1 for used_label in runtime.labels.values() if used_label == label)
        if used:
            raise LabelConflict(f"{used} example(s) of task {name!r} have label {label!r}: delete them first")
        shrunk = task.model_copy(update={"labels": {k: v for k, v in task.labels.items() if k != label}})
        if swap_spec(registry.client, raw, shrunk, log_key=runtime.log.stream_key, log_offset=offset):
            registry.runtime(name)
            return shrunk
    raise SpecBusy(f"the spec or the examples of task {name!r} kept changing; try again")


def _stored(registry: TaskRegistry, name: str) -> tuple[bytes, Task]:
    raw = cast("bytes | None", registry.client.hget(TASKS_KEY, name))  # see services/bus/replies.py
    if raw is None:
        raise NoSuchTask(name)
    return raw, read_spec(name, raw)  # BrokenTask when it no longer validates
