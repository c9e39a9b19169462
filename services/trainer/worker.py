"""One training job: read the task's examples from the log, train, re-embed, write, publish.

The examples are the log folded up to its last entry (`ExampleLog.examples`: adds minus deletes). A job
trains them with the library's one fit pipeline, as a library user does (`openbook.Estimator.fit` and
`.save`): one in four is held out as dev, chosen by a hash of its id (`openbook.dev_split`), so the dev
set grows with the log but never reshuffles; dev serves the choice of k, T and lambda (and the dev checks
that keep the best weights, where a job asks for them), and the promotion gate (gate.py), and is never
trained on. After training, the store is rebuilt from all the examples, under their log ids, with the
trained weights. The
checkpoint is written atomically under `artifacts_dir/<task>/<version>`; the
gate decides whether it is published or kept as a rejected version, in one
script with its version record (services.bus.versions), and retention then
deletes the versions it does not keep. The job is
acknowledged after publishing, so a crash before that leaves it pending: the
worker takes it back when it restarts, and any worker does once the crash is
known (jobs.JobQueue.release) or the entry has been idle for a minute.

While it runs, a worker sends a heartbeat (services.bus.workers) that also
keeps its job's entry fresh, and checks at each training step that the job is
still its own: a job cancelled meanwhile (its task deleted), or a worker asked to stop, raises from
`fit`'s `on_step` (`_report`), which stops training there. At
start it sweeps the staging directories that writers killed mid-write left
behind (services.trainer.staging). Once a job has ended, the worker queues
its task's next automatic job if one is due (services.engine.autotrain).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import redis
from openbook.artifacts import MANIFEST_NAME, sha256_file
from openbook.backbone import BackboneConfig, load_backbone
from openbook.config_fields import default_of
from openbook.dev_split import split_dev
from openbook.estimator import Estimator
from openbook.methods import build_method

from services.bus.examples_log import ExampleLog
from services.bus.jobs import Job, JobQueue, TaskGone
from services.bus.keys import TASKS_KEY
from services.bus.versions import (
    Published,
    current_checkpoint,
    directory_bytes,
    new_record,
    publish_checkpoint,
    retain,
)
from services.bus.workers import beat, forget
from services.engine.autotrain import queue_if_due
from services.engine.task_spec import Task, task_classifier
from services.trainer.gate import judge, untrained_score
from services.trainer.staging import sweep_staging, writing

logger = logging.getLogger(__name__)


class JobError(ValueError):
    """A job that cannot be trained as asked (its record says why)."""


class Interrupted(Exception):
    """The worker was asked to stop in the middle of a job."""


class NotOurs(Exception):
    """The job was cancelled (its task deleted) or taken over by another worker while this one trained it."""


class Worker:
    def __init__(
        self,
        client: redis.Redis,
        artifacts_dir: str | Path,
        *,
        consumer: str = "worker-1",
        device: str | None = None,  # None: BackboneConfig's default ($OPENBOOK_DEVICE, else auto)
        max_length: int = BackboneConfig.max_length,
        heartbeat_ttl_s: float = 10.0,
        keep_versions: int = 3,
        # A first candidate must do at least as well as the untrained task (gate.py).
        untrained_gate: bool = True,
    ) -> None:
        self.untrained_gate = untrained_gate
        self.client = client
        self.queue = JobQueue(client)
        self.artifacts_dir = Path(artifacts_dir)
        self.consumer = consumer
        self.device: str = default_of(BackboneConfig, "device") if device is None else device
        self.max_length = max_length
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.keep_versions = keep_versions  # besides the serving and the pinned ones (services.bus.versions)
        self.stop: threading.Event | None = None  # set by run_forever: a stop request ends a job early
        self.current: tuple[str, Job] | None = None  # (entry id, job) while a job runs

    def run_once(self, block_ms: int = 1000) -> str | None:
        """Claim and run one job; returns its id, or None when there was none."""
        claimed = self.queue.claim(self.consumer, block_ms=block_ms)
        if claimed is None:
            return None
        entry_id, job = claimed
        self.current = claimed
        try:
            with writing(self.artifacts_dir, job.task):
                published, metrics, gate = self.train_and_publish(job)
        except Interrupted:
            # Not acknowledged, and queued again at once: any worker takes it, this one after a restart too.
            self.queue.release(self.consumer, "interrupted: its worker stopped")
            return job.id
        except NotOurs:
            pass  # its record already says why (cancelled, or running on another worker)
        except TaskGone as gone:  # deleted while it trained: the record says cancelled; the checkpoint goes
            if gone.checkpoint is not None:
                shutil.rmtree(gone.checkpoint, ignore_errors=True)
        except redis.ConnectionError:
            raise  # Redis is away: the entry stays pending, and this worker takes the job back first
        except Exception as error:  # the record says why; the job is not retried forever
            self.queue.report(job.id, self.consumer, state="failed", error=f"{type(error).__name__}: {error}")
        else:
            self.queue.report(
                job.id,
                self.consumer,
                state="succeeded",
                progress=1.0,
                metrics=metrics,
                gate=gate,
                **({} if published is None else {"published": dataclasses.asdict(published)}),
            )
        finally:
            self.current = None
        self.queue.ack(entry_id, self.consumer)
        queue_if_due(self.client, job.task)  # examples that came while it ran may make the next one due
        return job.id

    def run_forever(self, stop: threading.Event) -> None:
        self.stop = stop
        for path in sweep_staging(self.artifacts_dir):
            logger.warning("removed %s: staged by a checkpoint writer that did not finish", path)
        beating = threading.Thread(target=self._beat_until, args=(stop,), daemon=True)
        beating.start()
        try:
            while not stop.is_set():
                try:
                    self.run_once(block_ms=500)
                except redis.ConnectionError:
                    stop.wait(1.0)  # Redis is away: wait, then reconnect on the next call
        finally:
            beating.join(timeout=30)
            with contextlib.suppress(redis.RedisError):
                forget(self.client, self.consumer)  # a clean stop: not alive any more, at once

    def heartbeat(self) -> None:
        """Say this worker is alive, and keep the entry of the job it runs from looking abandoned."""
        current = self.current
        beat(self.client, self.consumer, ttl_s=self.heartbeat_ttl_s, job=current[1].id if current else None)
        if current is not None:
            self.queue.touch(current[0], self.consumer)

    def _beat_until(self, stop: threading.Event) -> None:
        while True:
            with contextlib.suppress(redis.RedisError):  # Redis is away: the next beat tries again
                self.heartbeat()
            if stop.wait(self.heartbeat_ttl_s / 3):
                return

    def _report(self, job: Job, **fields: Any) -> None:
        """Progress, loss or stage into the job's record; where the worker is stopping, or the job is no
        longer its own, training stops here."""
        if self.stop is not None and self.stop.is_set():
            raise Interrupted(job.id)
        if "stage" in fields:  # when it began: a client shows how long a stage with no count has taken
            fields["stage_since"] = round(time.time(), 3)
        try:
            ours = self.queue.report(job.id, self.consumer, **fields)
        except redis.ConnectionError:
            return  # progress is best effort while Redis is away; the training goes on
        if not ours:
            raise NotOurs(job.id)

    def train_and_publish(self, job: Job) -> tuple[Published | None, dict, dict]:
        """Train, gate, then publish or keep as rejected: (the published pointer or None, metrics, gate)."""
        raw = self.client.hget(TASKS_KEY, job.task)
        if raw is None:
            raise JobError(f"no task {job.task!r}")
        task = Task.model_validate_json(raw)
        folded = ExampleLog(self.client, job.task).examples()
        examples, offset = folded.examples, folded.offset
        if len({label for _, label in examples.values()}) < 2 or offset is None:
            raise JobError("training needs examples of at least 2 labels")
        self._report(job, stage="preparing")  # the backbone's load and the untrained rival's score first
        backbone = load_backbone(
            BackboneConfig(name=task.backbone, max_length=self.max_length, device=self.device)
        )
        method = build_method(job.method)
        untrained = None  # a first candidate's rival, scored before training changes the backbone
        if self.untrained_gate and not job.force and current_checkpoint(self.client, job.task) is None:
            untrained = untrained_score(task, backbone, examples, *split_dev(examples))
        version = f"{time.strftime('%Y%m%d-%H%M%S')}-{job.id[:8]}"
        estimator = Estimator(task_classifier(task, backbone), method)
        ids = list(examples)
        report = estimator.fit(
            [examples[i][0] for i in ids],
            [examples[i][1] for i in ids],
            ids=ids,  # held out as dev by their hash; the served store holds every one, dev included
            on_step=lambda step, steps, loss: self._report(job, progress=round(step / steps, 4), loss=loss),
            on_stage=lambda stage: self._report(job, stage=stage),
            **job.train_config,
        )
        extra = {"task": job.task, "job": job.id, "version": version, "log_offset": offset}
        path = estimator.save(self.artifacts_dir / job.task / version, extra=extra)
        classifier, train_ids, dev_ids = estimator.classifier, report.train_ids, report.dev_ids
        metrics = {**report.dev_metrics, "train": len(train_ids), "dev": len(dev_ids)}
        self._report(job, stage="judging")  # the promotion gate, then publishing
        serving = current_checkpoint(self.client, job.task)
        gate = judge(
            classifier,
            serving,
            task,
            self.device,
            examples,
            train_ids,
            dev_ids,
            force=job.force,
            untrained=untrained,
            candidate_dev=report.dev_scores,  # dev as the candidate serves it, scored in calibration
        )
        record = new_record(
            version=version,
            method=method.spec,
            job=job.id,
            gate=gate,
            dev_metrics=report.dev_metrics,
            train=len(train_ids),
            dev=len(dev_ids),
            size_bytes=directory_bytes(path),
            created=time.time(),
        )
        published = Published(version, str(path), sha256_file(path / MANIFEST_NAME), offset)
        promoted = gate["verdict"] != "rejected"
        publish_checkpoint(self.client, job, published, record, serve=promoted)
        try:
            retain(self.client, job.task, self.artifacts_dir, self.keep_versions)
        except redis.RedisError as error:  # the versions are kept a while longer; the next job retries
            logger.warning("task %s: retention did not run: %s", job.task, error)
        return (published if promoted else None), metrics, gate
