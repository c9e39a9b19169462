"""Adding labels to a live task, and removing one that nothing depends on (routes/labels.py); an
upload of examples that creates the labels it names (routes/examples.py).

A label added is served at once: the stored spec grows (services/bus/task_labels.py), and each
replica, on its next request for the task, grows its classifier in place (Runtimes.runtime):
the served checkpoint and the store stay, the LM scores the new label by its word, and its examples
enter the store as they come. The next training trains the label like any other.

A label is removed only if no current example uses it and the served checkpoint was not trained
with it: such a checkpoint's head has the label's row, and serving it without the label would be
another model. A label added since the served checkpoint, with no examples yet, can go.
"""

from __future__ import annotations

from collections.abc import Sequence

from openbook.label_names import LabelNameError, readable_word
from openbook.labels import LabelError, add_labels

from services.bus.examples_log import Appended, NewExample, SpecChanged, SpecSwap
from services.bus.task_labels import served_labels, swap_spec
from services.engine.runtimes import Runtimes
from services.engine.task_spec import MAX_LABELS, Task

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


class TooManyLabels(ValueError):
    """The labels added would take the task over MAX_LABELS."""


def add_task_labels(runtimes: Runtimes, name: str, labels: dict[str, str]) -> Task:
    """Add `labels` (label -> word) to task `name`, all or none; returns the stored spec (blocking)."""
    for _ in range(ATTEMPTS):
        raw, grown = grown_spec(runtimes, name, labels)
        if swap_spec(runtimes.specs.client, raw, grown):
            runtimes.runtime(name)  # this replica follows at once: the labels' examples are taken now
            return grown
    raise SpecBusy(f"the spec of task {name!r} kept changing; try again")


def grown_spec(
    runtimes: Runtimes, name: str, labels: dict[str, str], stored: tuple[bytes, Task] | None = None
) -> tuple[bytes, Task]:
    """The task's stored spec (raw, for a compare-and-set; `stored` if given, as read) and the spec with
    `labels` added, once every check has passed; nothing is written. LabelConflict if one exists,
    TooManyLabels, BadWord if the classifier that will serve them cannot score a word."""
    raw, task = stored or _stored(runtimes, name)
    there = [label for label in labels if label in task.labels]
    if there:
        raise LabelConflict(
            f"task {name!r} has label {there[0]!r} already (word {task.labels[there[0]]!r})"
            + (f", and {len(there) - 1} more of those given" if len(there) > 1 else "")
        )
    if len(task.labels) + len(labels) > MAX_LABELS:
        raise TooManyLabels(
            f"task {name!r} has {len(task.labels)} labels; {len(labels)} more would take it over the most "
            f"a task may have, {MAX_LABELS}"
        )
    runtime = runtimes.runtime(name)  # level with the spec: its classifier has the labels read above
    if runtime is None:
        raise NoSuchTask(name)
    try:  # the words checked on the classifier that will serve them, before anything is written
        add_labels(runtime.classifier, labels)
    except LabelError as error:
        raise BadWord(str(error)) from None
    return raw, task.model_copy(update={"labels": {**task.labels, **labels}})


def append_creating_labels(runtimes: Runtimes, name: str, examples: Sequence[NewExample]) -> list[Appended]:
    """Append `examples` to task `name`'s log, adding first the labels they name that the task lacks,
    each scored by its readable word (openbook.label_names), in one atomic write: the labels and the
    examples are stored together or not at all (blocking).

    Raises what `ExampleLog.append` raises, and, with nothing written: BadNewLabel (a name with no word
    in it, or whose word another label has), TooManyLabels, BadWord, SpecBusy, NoSuchTask.
    """
    for _ in range(ATTEMPTS):
        raw, task = _stored(runtimes, name)
        missing = list(dict.fromkeys(e.label for e in examples if e.label not in task.labels))
        runtime = runtimes.runtime(name)
        if runtime is None:
            raise NoSuchTask(name)
        if not missing:
            return runtime.log.append(examples)
        _, grown = grown_spec(runtimes, name, _new_label_words(task, missing), (raw, task))
        try:
            appended = runtime.log.append(examples, spec_swap=SpecSwap(raw, grown.model_dump_json()))
        except SpecChanged:
            continue  # decided again on the spec as it is now
        runtimes.runtime(name)  # this replica follows at once, before it takes the examples
        return appended
    raise SpecBusy(f"the spec of task {name!r} kept changing; try again")


class BadNewLabel(ValueError):
    """A label an upload would create that cannot be: `label` is the one at fault."""

    def __init__(self, label: str, message: str) -> None:
        super().__init__(message)
        self.label = label


def _new_label_words(task: Task, names: Sequence[str]) -> dict[str, str]:
    """Label name -> readable word for labels to create; BadNewLabel for a name with no word in it, or
    whose word is another label's."""
    taken = {word: label for label, word in task.labels.items()}
    words = {}
    for label in names:
        try:
            word = readable_word(label)
        except LabelNameError as error:
            raise BadNewLabel(label, str(error)) from None
        if word in taken:
            raise BadNewLabel(
                label,
                f"label {label!r} would have the word {word!r}, which label {taken[word]!r} has: add it "
                f"with a word of its own first (POST /v1/tasks/{task.name}/labels)",
            )
        words[label], taken[word] = word, label
    return words


def remove_task_label(runtimes: Runtimes, name: str, label: str) -> Task:
    """Remove `label` from task `name` if nothing depends on it; returns the stored spec (blocking)."""
    for _ in range(ATTEMPTS):
        raw, task = _stored(runtimes, name)
        if label not in task.labels:
            raise NoSuchLabel(f"task {name!r} has no label {label!r}; labels: {list(task.labels)}")
        if len(task.labels) <= 2:
            raise LabelConflict(f"task {name!r} would be left with fewer than 2 labels")
        try:
            version, trained = served_labels(runtimes.specs.client, name)
        except (OSError, ValueError, KeyError) as error:
            raise LabelConflict(f"the served checkpoint's labels cannot be read: {error}") from None
        if label in trained:
            raise LabelConflict(
                f"the served checkpoint {version} was trained with label {label!r}: its head scores "
                "the label, so the label stays while a checkpoint trained with it is served"
            )
        runtime = runtimes.runtime(name)
        if runtime is None:
            raise NoSuchTask(name)
        runtime.catch_up()
        with runtime.lock:  # the offset and the examples it covers, read together
            offset = runtime.offset
            used = sum(1 for used_label in runtime.labels.values() if used_label == label)
        if used:
            raise LabelConflict(f"{used} example(s) of task {name!r} have label {label!r}: delete them first")
        shrunk = task.model_copy(update={"labels": {k: v for k, v in task.labels.items() if k != label}})
        if swap_spec(runtimes.specs.client, raw, shrunk, log_key=runtime.log.stream_key, log_offset=offset):
            runtimes.runtime(name)
            return shrunk
    raise SpecBusy(f"the spec or the examples of task {name!r} kept changing; try again")


def _stored(runtimes: Runtimes, name: str) -> tuple[bytes, Task]:
    stored = runtimes.specs.stored(name)  # BrokenTask when it no longer validates
    if stored is None:
        raise NoSuchTask(name)
    return stored
