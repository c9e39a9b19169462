"""A task's runtime on one replica: its classifier, kept level with the task's example log.

The store is derived from the task's example log: a replica replays the log
from its last applied offset before answering, so its store holds every
example acknowledged so far. The classifier and its store are not
thread-safe: one lock per task serialises inference and replay, which run in
worker threads, off the event loop. A published checkpoint is swapped in
under the same lock (`TaskRuntime.adopt`). Its fields change only through its
own methods: the replica's runtimes (runtimes.py) and the checkpoint follower
(swap.py) call `bind_spec`, `take_settings`, `grow_labels`, `readopt` and
`record_refusal`, never assign them (tests/services/test_layers.py).

LoRA tasks on one shared backbone can answer in one forward (`openbook.mixed`): `predict_together`
takes the lock of every task in the batch, in one order, checks and catches each up as `predict`
does, and runs the rows of those that mix as one forward, the others on their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import redis
from openbook.artifacts import MANIFEST_NAME, CheckpointError, sha256_file
from openbook.backbone import Backbone
from openbook.checkpoints import load_classifier, loads_onto
from openbook.classifier import Classifier
from openbook.demonstrations import DemoConfig, Demonstrations, retrieve_demonstrations
from openbook.labels import fit_to_labels
from openbook.mixed import MixedForward
from openbook.predictions import Prediction
from openbook.prompting import TextInput
from openbook.quality import Scored, leave_one_out

from services.bus.examples_log import ExampleLog, LogEntry, SpecAndEntries, fold
from services.bus.versions import Published
from services.engine.lambda_refresh import LAMBDA_WAIT_S, LambdaRefresh
from services.engine.replay import replay
from services.engine.task_spec import Task


class StaleRuntime(Exception):
    """Redis no longer holds the spec and generation a runtime was built for: it must not serve."""

    def __init__(self, name: str) -> None:
        super().__init__(f"task {name!r} changed while this request was served; retry")
        self.name = name


# The report's leave-one-out pass takes the task's lock for this many examples at a time, and starts
# again at most this many times when a hot swap changes the classifier under it.
LOO_CHUNK = 64
LOO_ATTEMPTS = 3


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
    published: Published | None = None  # the checkpoint served, None for the untrained base
    texts: dict[int, TextInput] = field(default_factory=dict)  # id -> text, for neighbours and paging
    labels: dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    backbone: Backbone | None = None  # the replica's backbone of the task's name, shared by its tasks
    # which task of its name this is (task_spec.GENERATIONS_KEY): one deleted and created again under the
    # same spec, by any replica, is another task, and gets a runtime of its own
    generation: bytes = b"0"
    # the stored spec, as Redis holds it, that this runtime serves (`bind_spec`):
    # `predict` checks that Redis still holds it, so a runtime taken from the cache never serves stale
    spec: bytes = b""
    # the last leave-one-out pass (the report of an untrained task): the classifier and (model_version,
    # offset) it scored, and its scores
    loo_cache: tuple[Classifier, tuple[str, str], Scored] | None = None
    # one forward for the LoRA tasks on `backbone` (openbook.mixed); None: this task always runs alone
    mixer: MixedForward | None = None
    # what the replica does to a backbone it loads (compiles it, openbook.compiled); applied in `adopt` to
    # a checkpoint that brings a backbone of its own
    prepare_backbone: Callable[[Backbone], Backbone] | None = None
    # While untrained with `knn.lam` null, the classifier chooses λ on its stored examples
    # (openbook.lambda_on_store); where their label scores cost a pass over the label words' tree, this
    # thread scores them off the lock (services/engine/lambda_refresh.py)
    lam_refresh: LambdaRefresh = field(init=False)

    def __post_init__(self) -> None:
        self.lam_refresh = LambdaRefresh(self.task.name, self.lock, self._choosing_lambda)

    def bind_spec(self, raw: bytes) -> None:
        """Serve the spec Redis holds as `raw` (as `Runtimes.runtime` read it): `predict` checks it still
        does."""
        self.spec = raw

    def take_settings(self, task: Task) -> None:
        """The task's spec changed only in settings that keep the served model (its training settings,
        `min_confidence`): serve on, under the new spec."""
        self.task = task

    def grow_labels(self, task: Task) -> None:
        """The task gained labels after its own (and nothing else changed): the classifier grows in place,
        keeping the served checkpoint and the store; a new label is scored by its words until trained."""
        with self.lock:
            self.classifier = fit_to_labels(self.classifier, task.labels)
            self.task = task

    def readopt(self, task: Task, device: str) -> None:
        """The task lost labels while a checkpoint is served: adopt that checkpoint again, fitted to the
        labels left. Raises what `adopt` raises; `Runtimes` then builds a fresh runtime."""
        assert self.published is not None, "an untrained runtime has no checkpoint to adopt again"
        self.task = task
        self.adopt(self.published, device)

    def record_refusal(self, published: Published, error: Exception) -> None:
        """A published checkpoint was refused (the old version keeps serving): say why, in `swap_error`."""
        self.swap_error = f"{published.version}: {type(error).__name__}: {error}"

    def catch_up(self, lambda_wait_s: float = LAMBDA_WAIT_S) -> None:
        """Apply the log entries after `offset` (blocking: call from a worker thread), then wait up to
        `lambda_wait_s` for an untrained task's λ to catch up with them (lambda_refresh.py)."""
        with self.lock:
            self._apply_log(self.log.read(after=self.offset))
        self.lam_refresh.settle(lambda_wait_s)

    def key_book(self) -> None:
        """Bring a sentence reader's book level with the store now, rather than in the next request (it
        embeds every stored example: seconds for thousands). Nothing to do without a reader."""
        with self.lock:
            self.classifier.knn_book()

    def _apply_log(self, entries: Sequence[LogEntry]) -> None:  # the log after `offset`; the lock is held
        classifier = self.classifier
        replay(classifier, entries)  # the keys, with the label scores λ reads where they come free
        self._remember(entries)
        if self._choosing_lambda() is None or not len(classifier.lam_on_store.unscored(classifier.store)):
            return  # λ follows the store at the next prediction (`Classifier.served_knn`)
        if classifier.scores_words_by_tree:  # the scores, and λ, in the thread
            self.lam_refresh.due()
        else:  # a classifier new since (grown by labels): its scores here, at once
            classifier.score_unscored()

    def _choosing_lambda(self) -> Classifier | None:
        """The classifier, while it chooses λ on the stored examples: untrained, and no λ in the task's
        spec (a trained version's was chosen on dev). The caller holds the lock."""
        return self.classifier if self.classifier.knn.lam is None else None

    def _remember(self, entries: Sequence[LogEntry]) -> None:
        folded = fold(entries)
        for example_id in folded.deleted:
            self.texts.pop(example_id, None)
            self.labels.pop(example_id, None)
        for example_id, (text, label) in folded.examples.items():
            self.texts[example_id], self.labels[example_id] = text, label
        if folded.offset is not None:
            self.offset = folded.offset

    def predict(self, texts: Sequence[TextInput]) -> tuple[list[Prediction], str, str]:
        """Catch up with the log, then predict: with the model and store versions that made them.

        One read per (micro-)batch, under the same lock as the forward: of the task's spec and generation
        and of the log's new entries, in one round trip. Every request in the batch sees each example
        acknowledged before the batch started, by any replica; if the task changed or was deleted since
        this runtime was looked up, it raises StaleRuntime and serves nothing. With Redis unreachable it
        serves from memory: everything applied so far.
        """
        with self.lock:
            self._ready_to_serve()
            return self.classifier.predict(texts), self.model_version, self.offset

    def _ready_to_serve(self) -> None:  # the caller holds the lock
        with contextlib.suppress(redis.ConnectionError):
            read = self.log.read_with_spec(after=self.offset)
            if not self._is_current(read):
                raise StaleRuntime(self.task.name)
            self._apply_log(read.entries)

    def mixes(self) -> bool:
        """Whether this task's requests may share a forward with other LoRA tasks on its backbone."""
        return self.mixer is not None and self.mixer.mixes(self.classifier)

    def _is_current(self, read: SpecAndEntries) -> bool:
        """Whether Redis held, at `read`, the very spec and generation this runtime serves."""
        return read.spec is not None and read.spec == self.spec and read.generation == self.generation

    def leave_one_out(self, on_chunk: Callable[[int, int], None] | None = None) -> tuple[Scored, str, str]:
        """Every labelled example scored with itself kept out of the store: (scores, model version, store
        version). Blocking; run it in a worker thread.

        The lock is taken per chunk of examples, not for the whole pass, so classify requests go on
        between chunks. A hot swap in the middle starts the pass again on the new classifier. The result
        is kept until the model or the store changes. `on_chunk(scored, examples)` is called as a pass
        starts and after each chunk (not when the kept result answers); an exception it raises ends the
        pass there, and comes out of here.
        """
        for _ in range(LOO_ATTEMPTS):
            with self.lock:
                with contextlib.suppress(redis.ConnectionError):  # Redis away: what the store holds so far
                    self._apply_log(self.log.read(after=self.offset))
                classifier, key = self.classifier, (self.model_version, self.offset)
                cache = self.loo_cache
                if cache is not None and cache[0] is classifier and cache[1] == key:
                    return cache[2], *key
                known = set(classifier.labels)
                ids = np.array([i for i in sorted(self.labels) if self.labels[i] in known], dtype=np.int64)
                texts, labels = [self.texts[int(i)] for i in ids], [self.labels[int(i)] for i in ids]
            nothing = np.zeros((0, len(known)))
            parts = [Scored(ids[:0], ids[:0], nothing, nothing, nothing)]  # what no example gives
            if on_chunk is not None:
                on_chunk(0, len(ids))
            for start in range(0, len(ids), LOO_CHUNK):
                with self.lock:
                    if self.classifier is not classifier:  # swapped meanwhile: start again on the new one
                        break
                    chunk = slice(start, start + LOO_CHUNK)
                    parts.append(leave_one_out(classifier, texts[chunk], labels[chunk], ids[chunk]))
                if on_chunk is not None:
                    on_chunk(min(start + LOO_CHUNK, len(ids)), len(ids))
            else:
                scored = Scored.concatenate(parts)
                self.loo_cache = (classifier, key, scored)
                return scored, *key
        raise StaleRuntime(self.task.name)

    def demonstrations(self, text: TextInput) -> Demonstrations:
        """What demonstrations would retrieve for `text`: per class, neighbours and their weights in the
        class vector (textual demonstrations write the same neighbours out, nearest first)."""
        with self.lock:
            query = self.classifier.embed_vectors([text]).vectors
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
        onto = backbone_to_load_onto(Path(published.path), self.backbone)
        classifier, _ = load_classifier(published.path, device=device, backbone=onto)  # verifies every file
        if onto is None and self.prepare_backbone is not None:  # fine-tuned: its own backbone
            self.prepare_backbone(classifier.backbone)
        classifier.batch_size = self.classifier.batch_size  # the replica's, as `TaskSpecs.build` set it
        # Labels added since the checkpoint was trained are scored by their words until the next
        # training (openbook.labels); a checkpoint with a label the task no longer has is refused.
        classifier = fit_to_labels(classifier, self.task.labels)
        entries = self.log.read(after=published.log_offset)
        replay(classifier, entries)  # examples added since the trainer read the log
        caught = entries[-1].offset if entries else published.log_offset
        classifier.knn_book()  # a sentence reader keys its book here, off the lock (seconds for thousands)
        with self.lock:
            classifier = fit_to_labels(classifier, self.task.labels)  # labels added meanwhile
            start = min(caught, self.offset, key=_order)
            tail = self.log.read(after=start)
            replay(classifier, [e for e in tail if _order(e.offset) > _order(caught)])
            self._remember([e for e in tail if _order(e.offset) > _order(self.offset)])
            self.classifier, self.model_version, self.swap_error = classifier, published.version, None
            self.published = published  # its λ was chosen on dev: the refresh, if running, ends


Result = tuple[list[Prediction], str, str]  # predictions, model version, store version


def predict_together(
    mixer: MixedForward, parts: Sequence[tuple[TaskRuntime, Sequence[TextInput]]]
) -> list[Result | Exception]:
    """Each part's `runtime.predict(texts)`, the LoRA tasks' rows in one forward (blocking).

    One task's failure (a StaleRuntime, texts it refuses) is that part's result, not the others'. The
    parts' runtimes must differ. Their locks are taken in one order (by task name), so two such
    calls never wait on each other in a cycle.
    """
    results: list[Result | Exception | None] = [None] * len(parts)
    with ExitStack() as held:
        for runtime in sorted({id(r): r for r, _ in parts}.values(), key=lambda r: r.task.name):
            held.enter_context(runtime.lock)
        together = []
        for i, (runtime, texts) in enumerate(parts):
            try:
                runtime._ready_to_serve()
                if not mixer.mixes(runtime.classifier):  # swapped to another kind of model meanwhile
                    results[i] = runtime.classifier.predict(texts), runtime.model_version, runtime.offset
                else:
                    together.append(i)
            except Exception as error:  # the caller hands it to that request alone
                results[i] = error
        if together:
            try:
                mixed: list[list[Prediction]] | None = mixer.predict(
                    [(parts[i][0].classifier, parts[i][1]) for i in together]
                )
            except Exception:  # e.g. texts one task's encoder refuses: each part alone
                mixed = None
            for k, i in enumerate(together):
                runtime, texts = parts[i]
                try:
                    predictions = mixed[k] if mixed is not None else runtime.classifier.predict(texts)
                    results[i] = predictions, runtime.model_version, runtime.offset
                except Exception as error:
                    results[i] = error
    assert all(r is not None for r in results)  # each part was answered above, or failed
    return cast("list[Result | Exception]", results)


def backbone_to_load_onto(checkpoint: Path, shared: Backbone | None) -> Backbone | None:
    """The shared backbone for a checkpoint whose method kept it frozen; None (a copy of its own) otherwise.

    Prompts, probes and LoRA adapters hold only their own tensors, so every such task of a replica
    runs on one copy of the backbone; a fine-tuned checkpoint changed the weights and loads its own.
    """
    return shared if shared is not None and loads_onto(checkpoint, shared) else None
