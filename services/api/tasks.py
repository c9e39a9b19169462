"""Tasks as the api holds them: a spec in Redis, and per replica a classifier kept level with the log.

The store is derived from the task's example log: a replica replays the log
from its last applied offset before answering, so its store holds every
example acknowledged so far. The classifier and its store are not
thread-safe: one lock per task serialises inference and replay, which run in
worker threads, off the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.calibration import label_bias
from openbook.classifier import Classifier, Prediction
from openbook.knn import KnnConfig
from openbook.prompting import Template, TextInput, Verbalizer

from services.api.schemas import Task
from services.bus.examples_log import ExampleLog, LogEntry
from services.bus.replay import replay

TASKS_KEY = "openbook:tasks"


class TaskExists(ValueError):
    pass


def build_classifier(task: Task, backbone: Backbone) -> Classifier:
    """The untrained classifier a task starts from; bad templates or label words raise PromptError."""
    verbalizer = Verbalizer(tuple(task.labels), tuple(task.labels.values()))
    classifier = Classifier(
        backbone,
        Template(task.template),
        verbalizer,
        knn=KnnConfig(task.knn.k, task.knn.temperature, task.knn.lam),
    )
    classifier.label_bias = label_bias("content-free", classifier)  # no data yet: calibrate on "N/A"
    return classifier


@dataclass
class TaskRuntime:
    task: Task
    classifier: Classifier
    log: ExampleLog
    offset: str = "0-0"  # last log entry applied to the store
    model_version: str = "base"
    texts: dict[int, TextInput] = field(default_factory=dict)  # id -> text, for neighbours and paging
    labels: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def catch_up(self) -> None:
        """Apply the log entries after `offset` (blocking: call from a worker thread)."""
        with self.lock:
            self._apply(self.log.read(after=self.offset))

    def _apply(self, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        replay(self.classifier, entries)
        for entry in entries:
            if entry.op == "add":
                assert entry.text is not None and entry.label is not None
                self.texts[entry.id], self.labels[entry.id] = entry.text, entry.label
            else:
                self.texts.pop(entry.id, None)
                self.labels.pop(entry.id, None)
        self.offset = entries[-1].offset

    def predict(self, texts: Sequence[TextInput]) -> list[Prediction]:
        with self.lock:
            return self.classifier.predict(texts)


class TaskRegistry:
    """Task specs in one Redis hash; classifiers built on first use, one backbone per name."""

    def __init__(self, client: redis.Redis, *, max_length: int, device: str) -> None:
        self.client = client
        self.max_length = max_length
        self.device = device
        self.runtimes: dict[str, TaskRuntime] = {}
        self._backbones: dict[str, Backbone] = {}
        self._lock = threading.Lock()

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

    def delete(self, name: str) -> bool:
        log = ExampleLog(self.client, name)
        removed = self.client.hdel(TASKS_KEY, name)
        self.client.delete(log.stream_key, log.ids_key, log.counter_key)
        self.runtimes.pop(name, None)
        return bool(removed)

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
            classifier = build_classifier(task, self.backbone(task.backbone))
            runtime = TaskRuntime(task, classifier, ExampleLog(self.client, name))
            self.runtimes[name] = runtime
        return runtime
