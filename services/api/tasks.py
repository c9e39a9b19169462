"""Tasks as the api holds them: a spec in Redis, and per replica a classifier kept level with the log.

The store is derived from the task's example log: a replica replays the log
from its last applied offset before answering, so its store holds every
example acknowledged so far. The classifier and its store are not
thread-safe: one lock per task serialises inference and replay, which run in
worker threads, off the event loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from openbook.artifacts import MANIFEST_NAME, CheckpointError, sha256_file
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.checkpoints import load_classifier
from openbook.classifier import Classifier, Prediction
from openbook.demonstrations import DemoConfig, Demonstrations, retrieve_demonstrations
from openbook.prompting import TextInput

from services.bus.deletion import delete_task
from services.bus.examples_log import ExampleLog, LogEntry
from services.bus.jobs import Published
from services.bus.replay import replay
from services.bus.task_spec import TASKS_KEY, Task, build_classifier


class TaskExists(ValueError):
    pass


def _order(offset: str) -> tuple[int, int]:
    milliseconds, _, sequence = offset.partition("-")
    return int(milliseconds), int(sequence or 0)


@dataclass
class TaskRuntime:
    task: Task
    classifier: Classifier
    log: ExampleLog
    offset: str = "0-0"  # last log entry applied to the store
    model_version: str = "base"
    swap_error: str | None = None  # why the last published checkpoint was refused, if it was
    texts: dict[int, TextInput] = field(default_factory=dict)  # id -> text, for neighbours and paging
    labels: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def catch_up(self) -> None:
        """Apply the log entries after `offset` (blocking: call from a worker thread)."""
        with self.lock:
            self._apply_log()

    def _apply_log(self) -> None:  # the caller holds the lock
        entries = self.log.read(after=self.offset)
        replay(self.classifier, entries)
        self._remember(entries)

    def _remember(self, entries: Sequence[LogEntry]) -> None:
        for entry in entries:
            if entry.op == "add":
                assert entry.text is not None and entry.label is not None
                self.texts[entry.id], self.labels[entry.id] = entry.text, entry.label
            else:
                self.texts.pop(entry.id, None)
                self.labels.pop(entry.id, None)
            self.offset = entry.offset

    def predict(self, texts: Sequence[TextInput]) -> tuple[list[Prediction], str, str]:
        """Catch up with the log, then predict: with the model and store versions that made them.

        One log read per (micro-)batch, under the same lock as the forward, so every request in the
        batch sees each example acknowledged before the batch started. With Redis unreachable it serves
        from memory: everything applied so far.
        """
        with self.lock:
            with contextlib.suppress(redis.ConnectionError):
                self._apply_log()
            return self.classifier.predict(texts), self.model_version, self.offset

    def demonstrations(self, text: TextInput) -> Demonstrations:
        """What neural demonstrations would retrieve for `text`: per class, neighbours and weights."""
        with self.lock:
            query = self.classifier.embed([text], vectors_only=True).vectors
            config = self.classifier.demos or DemoConfig()
            return retrieve_demonstrations(self.classifier.store, query, len(self.classifier.labels), config)

    def adopt(self, published: Published, device: str) -> None:
        """Swap in a published checkpoint: verify, load and catch up off the lock, then swap under it.

        Requests hold the lock while they predict, so each finishes on the version it started with.
        A checkpoint that fails verification raises CheckpointError and the old version keeps serving.
        """
        manifest = Path(published.path) / MANIFEST_NAME
        if not manifest.is_file() or sha256_file(manifest) != published.manifest_sha256:
            raise CheckpointError(f"{published.path}: manifest missing or not the one published")
        classifier, _ = load_classifier(published.path, device=device)  # verifies every file's sha256
        entries = self.log.read(after=published.log_offset)
        replay(classifier, entries)  # examples added since the trainer read the log
        caught = entries[-1].offset if entries else published.log_offset
        with self.lock:
            start = min(caught, self.offset, key=_order)
            tail = self.log.read(after=start)
            replay(classifier, [e for e in tail if _order(e.offset) > _order(caught)])
            self._remember([e for e in tail if _order(e.offset) > _order(self.offset)])
            self.classifier, self.model_version, self.swap_error = classifier, published.version, None


class TaskRegistry:
    """Task specs in one Redis hash; classifiers built on first use, one backbone per name."""

    def __init__(self, client: redis.Redis, *, max_length: int, device: str) -> None:
        self.client = client
        self.max_length = max_length
        self.device = device
        self.runtimes: dict[str, TaskRuntime] = {}
        self._backbones: dict[str, Backbone] = {}
        self._lock = threading.Lock()  # guards _backbones
        self._building = threading.Lock()  # guards building runtimes
        self.warmed = threading.Event()  # every task known at start-up is loaded and replayed

    def warm_up(self, stop: threading.Event) -> None:
        """Load every task and replay its log, so the first requests after a restart are served at once."""
        while not stop.is_set():
            try:
                for task in self.all():
                    runtime = self.runtime(task.name)
                    if runtime is not None:
                        runtime.catch_up()
            except redis.ConnectionError:
                stop.wait(1.0)  # Redis is not there yet: try again
                continue
            self.warmed.set()
            return

    def catch_up_all(self) -> None:
        for runtime in list(self.runtimes.values()):
            runtime.catch_up()

    def backbone(self, name: str) -> Backbone:
        with self._lock:
            if name not in self._backbones:
                config = BackboneConfig(name=name, max_length=self.max_length, device=self.device)
                self._backbones[name] = load_backbone(config)
            return self._backbones[name]

    def create(self, task: Task) -> bool:
        """Store a new task (False if the same spec exists); a different spec under the name raises."""
        build_classifier(task, self.backbone(task.backbone))  # a bad template or label fails here
        spec = task.model_dump_json()
        if not self.client.hsetnx(TASKS_KEY, task.name, spec):
            existing = self.client.hget(TASKS_KEY, task.name)
            if existing is not None and Task.model_validate_json(existing) != task:
                raise TaskExists(f"task {task.name!r} exists with another spec")
            return False
        return True

    def get(self, name: str) -> Task | None:
        raw = self.client.hget(TASKS_KEY, name)
        return None if raw is None else Task.model_validate_json(raw)

    def all(self) -> list[Task]:
        return [Task.model_validate_json(raw) for _, raw in sorted(self.client.hgetall(TASKS_KEY).items())]

    def delete(self, name: str, artifacts_dir: Path) -> bool:
        removed = delete_task(self.client, name, artifacts_dir)  # everything the task owned, disk included
        self.runtimes.pop(name, None)
        return removed

    def runtime(self, name: str) -> TaskRuntime | None:
        """The replica's classifier for a task, built on first use; the cached one while Redis is down."""
        try:
            task = self.get(name)
        except redis.ConnectionError:
            if name in self.runtimes:
                return self.runtimes[name]
            raise
        if task is None:
            self.runtimes.pop(name, None)
            return None
        runtime = self.runtimes.get(name)
        if runtime is None or runtime.task != task:
            with self._building:  # concurrent first requests (and the warm-up) build one runtime, not several
                runtime = self.runtimes.get(name)
                if runtime is None or runtime.task != task:
                    classifier = build_classifier(task, self.backbone(task.backbone))
                    runtime = TaskRuntime(task, classifier, ExampleLog(self.client, name))
                    self.runtimes[name] = runtime
        return runtime
