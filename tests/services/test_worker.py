"""The trainer worker's job (`services/trainer/worker.py`) against the library's `Estimator.fit`, on a real
Redis: the same examples under the same ids give the same classifier."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openbook
import redis
from openbook.backbone import BackboneConfig, load_backbone

from services.bus.examples_log import ExampleLog, NewExample
from services.bus.jobs import JobQueue
from services.bus.keys import TASKS_KEY
from services.engine.task_spec import Task, TrainOptions

KNOBS = {"steps": 4, "batch_size": 4, "lr": 3e-3, "eval_every": 2, "patience": 10}
QUERIES = ["great fun", "it was awful", "what is the answer to this question"]


def probabilities(predictions) -> np.ndarray:
    return np.array([list(p.probabilities.values()) for p in predictions])


def test_a_job_trains_the_classifier_that_fit_trains(server, causal_dir: Path, tmp_path: Path, toy) -> None:
    from services.trainer.worker import Worker

    texts, gold = toy.texts * 2, [toy.verbalizer.labels[i] for i in toy.labels] * 2
    ids = [3 * i + 1 for i in range(len(texts))]  # log ids need not be positions
    client = redis.Redis.from_url(server.url)
    task = Task(
        name="reviews",
        template="{text} It was {mask}",
        labels={"0": "bad", "1": "good"},
        backbone=str(causal_dir),
    )
    client.hset(TASKS_KEY, task.name, task.model_dump_json())
    ExampleLog(client, task.name).append(
        [NewExample(t, label, i) for t, label, i in zip(texts, gold, ids, strict=True)]
    )
    options = TrainOptions(**KNOBS)
    job_id = JobQueue(client).submit(task.name, task.method, options.train_config(), force=True)
    assert Worker(client, tmp_path / "artifacts", max_length=48).run_once(block_ms=100) == job_id
    job = JobQueue(client).get(job_id)
    assert job is not None and job["state"] == "succeeded", job

    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    estimator = openbook.create_classifier(task.template, task.labels, backbone=backbone, method=task.method)
    report = estimator.fit(texts, gold, ids=ids, **KNOBS, keep=options.keep)  # a service job's: the last
    metrics = job["metrics"]
    assert {k: metrics[k] for k in report.dev_metrics} == report.dev_metrics
    assert (metrics["train"], metrics["dev"]) == (len(report.train_ids), len(report.dev_ids))
    assert len(report.dev_ids) >= 2

    served = openbook.load(job["published"]["path"])
    fitted = openbook.load(estimator.save(tmp_path / "fit"))
    assert served.classifier.knn == fitted.classifier.knn
    np.testing.assert_array_equal(
        probabilities(served.predict(QUERIES)), probabilities(fitted.predict(QUERIES))
    )
    ours = json.loads((tmp_path / "fit" / "manifest.json").read_text())
    theirs = json.loads((Path(job["published"]["path"]) / "manifest.json").read_text())
    keys = ("dev_metrics", "dev_scores", "dev_scored_on", "training_data_sha256", "backbone", "train_config")
    for key in keys:
        assert ours[key] == theirs[key], key


def test_openbook_worker_takes_the_untrained_gate_from_its_settings(monkeypatch, tmp_path: Path) -> None:
    import argparse

    import services.trainer.worker
    from services.cli import worker

    built: list[dict] = []

    class Recorded:
        def __init__(self, client, artifacts, **options) -> None:
            built.append(options)

        def run_forever(self, stop) -> None:
            return None

    monkeypatch.setattr(services.trainer.worker, "Worker", Recorded)
    monkeypatch.setattr(worker.signal, "signal", lambda *args: None)  # the test process keeps its own
    monkeypatch.setattr(worker, "fit_threads", lambda threads: None)  # and its thread counts
    monkeypatch.setenv("OPENBOOK_DATA_DIR", str(tmp_path))
    for value, gate in (("true", True), ("false", False)):
        monkeypatch.setenv("OPENBOOK_UNTRAINED_GATE", value)
        assert worker.run(argparse.Namespace()) == 0
        assert built[-1]["untrained_gate"] is gate
    monkeypatch.delenv("OPENBOOK_UNTRAINED_GATE")
    assert worker.run(argparse.Namespace()) == 0
    assert built[-1]["untrained_gate"] is True  # on by default
