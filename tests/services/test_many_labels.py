"""A task at an intent set's size: 150 labels given by name, 10 examples each posted as a client would, a
few texts classified, and a training job run to its end, on the tiny backbone."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import redis

from services.api.app import create_app
from services.api.schemas import ExampleIn
from services.client import OpenBookClient
from services.trainer.worker import Worker
from tests.services.harness import api_settings, serving, wait_for

VERBS = ("book", "cancel", "change", "check", "find", "order", "pay", "report", "reset", "schedule")
NOUNS = ("flight", "hotel", "card", "bill", "account", "meeting", "payment", "password", "order", "balance")
NOUNS += ("car", "table", "ticket", "reminder", "alarm")
NAMES = [f"{verb}_{noun}" for verb, noun in itertools.product(VERBS, NOUNS)]  # book_flight, ...
PER_LABEL = 10
BATCH = 64  # the api's examples per POST (OPENBOOK_MAX_BATCH)
# The task's default method (retroprompt, which shows no demonstrations): one forward a text.
TRAIN = {"steps": 2, "batch_size": 8, "lr": 1e-3, "eval_every": 2, "force": True}


def test_a_task_of_150_label_names_takes_1500_examples_classifies_and_trains(
    server, masked_dir: Path, tmp_path: Path
) -> None:
    assert len(NAMES) == 150
    examples = [
        ExampleIn(text=f"please {name.replace('_', ' my ')} number {k}", label=name, id=i * PER_LABEL + k)
        for i, name in enumerate(NAMES)
        for k in range(PER_LABEL)
    ]
    timings = {}
    # The masked backbone: the causal one's 150 multi-token words (one tree pass over their prefixes)
    # are tested in tests/test_word_scores.py, and cost more than this suite affords here.
    with serving(create_app(api_settings(server.url, masked_dir))) as base, OpenBookClient(base) as client:
        started = time.perf_counter()
        # trained when asked: the one job is the test's
        task = client.create_task("intents", "{text} Intent: {mask}", NAMES, training={"auto": False})
        assert len(task.labels) == 150 and task.labels["book_flight"] == "book flight"
        assert task.label_scoring == "auto"  # the default: label vectors above 16 labels

        for first in range(0, len(examples), BATCH):
            ack = client.add_examples("intents", examples[first : first + BATCH])
            assert all(a.created for a in ack.examples)
        timings["post"] = time.perf_counter() - started

        texts = ["please book my flight number 3", "please reset my password number 7"]
        answer = client.classify("intents", texts, neighbours=True)
        for prediction, label in zip(answer.predictions, ("book_flight", "reset_password"), strict=True):
            assert len(prediction.probabilities) == 150
            assert prediction.neighbours is not None and prediction.neighbours[0].label == label

        job = client.train("intents", **TRAIN)
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job.id
        finished = client.job(job.id)
        assert finished.state == "succeeded", finished
        assert finished.method.startswith("retroprompt"), finished.method
        assert finished.published is not None  # forced past the gate: served
        (version,) = client.versions("intents").versions
        assert version.examples["train"] + version.examples["dev"] == 1500 and version.examples["dev"] > 0
        wait_for(lambda: client.classify("intents", texts[:1]).model_version == version.version)
        timings["total"] = time.perf_counter() - started
    print(f"150 labels: {timings}")


def test_a_task_scored_by_label_vectors_keeps_them_through_training(
    server, causal_dir: Path, tmp_path: Path
) -> None:
    """`label_scoring: vectors` on a causal backbone, the cheap scoring of 150 multi-token words: chosen at
    creation, used by classify (no pass over the words' tree) and kept by the trained version."""
    examples = [
        ExampleIn(text=f"please {name.replace('_', ' ')}", label=name, id=i) for i, name in enumerate(NAMES)
    ]
    app = create_app(api_settings(server.url, causal_dir))
    with serving(app) as base, OpenBookClient(base) as client:
        task = client.create_task(
            "vectors", "{text} Intent: {mask}", NAMES, label_scoring="vectors", training={"auto": False}
        )
        assert task.label_scoring == "vectors"
        for name, labels, scoring in (("two", 2, "exact"), ("many", 17, "vectors")):  # the default, auto
            assert client.create_task(name, "{text} Intent: {mask}", NAMES[:labels]).label_scoring == "auto"
            client.classify(name, ["please book flight"])
            assert app.state.runtimes.loaded[name].classifier.label_scoring == scoring
        body = {
            "name": "fast",
            "template": "{text} Intent: {mask}",
            "labels": NAMES[:2],
            "label_scoring": "fast",
        }
        refused = httpx.post(f"{base}/v1/tasks", json=body)  # a scoring that does not exist: nothing written
        assert refused.status_code == 422 and "label_scoring" in refused.text
        assert (
            httpx.get(f"{base}/v1/tasks/fast").status_code == 404
            and httpx.get(f"{base}/v1/tasks/vectors").is_success
        )
        for first in range(0, len(examples), BATCH):
            client.add_examples("vectors", examples[first : first + BATCH])
        runtime = app.state.runtimes.loaded["vectors"]
        assert runtime.classifier.label_scoring == "vectors" and not runtime.classifier.scores_words_by_tree
        answer = client.classify("vectors", ["please book flight"])
        assert len(answer.predictions[0].probabilities) == 150

        job = client.train("vectors", **TRAIN)
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job.id
        (version,) = client.versions("vectors").versions
        wait_for(lambda: client.classify("vectors", ["x"]).model_version == version.version)
        assert app.state.runtimes.loaded["vectors"].classifier.label_scoring == "vectors"
