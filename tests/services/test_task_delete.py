"""Deleting a task removes everything it owned, so a task re-created under its name starts clean."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from openbook.estimator import Estimator

from services.api.app import create_app
from services.api.settings import Settings
from services.bus.examples_log import ExampleLog
from services.bus.jobs import JobQueue
from services.bus.keys import autotrain_key
from services.bus.server import EmbeddedRedis
from services.bus.versions import checkpoints_key, current_checkpoint, current_key, versions_key
from services.trainer.worker import Worker
from tests.services.harness import wait_for

TASK = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
EXAMPLES = [
    {"text": "the movie was great and fun", "label": "1", "id": 1},
    {"text": "a good film with a great cast", "label": "1", "id": 2},
    {"text": "great fun", "label": "1", "id": 3},
    {"text": "it was terrible and boring", "label": "0", "id": 4},
    {"text": "a bad film , it was awful", "label": "0", "id": 5},
    {"text": "boring and bad", "label": "0", "id": 6},
]
TRAIN = {"method": "prompt-ft", "steps": 2, "batch_size": 4, "lr": 1e-3, "eval_every": 2}


@pytest.fixture()
def server(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


def api_client(server: EmbeddedRedis, causal_dir: Path, tmp_path: Path) -> TestClient:
    settings = Settings(
        redis_url=server.url,
        default_backbone=str(causal_dir),
        max_length=48,
        data_dir=tmp_path / "data",
    )
    return TestClient(create_app(settings))


def create_with_examples(api: TestClient) -> None:
    assert api.post("/v1/tasks", json=TASK).status_code == 201
    assert api.post("/v1/tasks/reviews/examples", json={"examples": EXAMPLES}).status_code == 201


def test_a_deleted_task_does_not_come_back_after_a_restart(server, causal_dir, tmp_path) -> None:
    client = redis.Redis.from_url(server.url)
    artifacts = tmp_path / "data" / "artifacts"
    worker = Worker(client, artifacts, max_length=48)
    with api_client(server, causal_dir, tmp_path) as api:
        create_with_examples(api)
        job_id = api.post("/v1/tasks/reviews/train", json=TRAIN).json()["id"]
        queued = api.post("/v1/tasks/reviews/train", json=TRAIN).json()["id"]
        assert worker.run_once(block_ms=100) == job_id
        published = current_checkpoint(client, "reviews")
        assert published is not None and Path(published.path).is_dir()
        assert client.hexists(versions_key("reviews"), published.version)  # its version record

        assert api.delete("/v1/tasks/reviews").status_code == 204
        assert not (artifacts / "reviews").exists()  # the checkpoints went with their task
        assert client.exists(checkpoints_key("reviews"), current_key("reviews"), versions_key("reviews")) == 0
        assert api.get(f"/v1/jobs/{queued}").json()["state"] == "cancelled"
        assert worker.run_once(block_ms=100) is None  # the cancelled job is dropped, not trained
        assert api.delete("/v1/tasks/reviews").status_code == 404

        assert api.post("/v1/tasks", json=TASK).status_code == 201  # the same spec under the same name

    with api_client(server, causal_dir, tmp_path) as restarted:  # a new api process, same Redis
        wait_for(lambda: restarted.get("/readyz").status_code == 200)
        assert restarted.get("/v1/tasks/reviews/examples").json()["examples"] == []
        # The checkpoints follower reads the task's stream from its start: give it time to (not) adopt.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            served = restarted.post(
                "/v1/tasks/reviews/classify", json={"texts": ["great fun"], "neighbours": True}
            ).json()
            assert served["model_version"] == "base" and served["predictions"][0]["neighbours"] == []
            time.sleep(0.1)
        assert restarted.app.state.runtimes.loaded["reviews"].swap_error is None


def test_a_job_of_a_deleted_task_does_not_publish_into_its_successor(
    server, causal_dir, tmp_path, monkeypatch
) -> None:
    client = redis.Redis.from_url(server.url)
    artifacts = tmp_path / "data" / "artifacts"
    with api_client(server, causal_dir, tmp_path) as api:
        create_with_examples(api)
        job_id = api.post("/v1/tasks/reviews/train", json=TRAIN).json()["id"]

        written: list[Path] = []
        save = Estimator.save

        def save_then_recreate(self, path, **kwargs):
            # The task is deleted and re-created while its job writes the checkpoint.
            saved = save(self, path, **kwargs)
            written.append(saved)
            assert api.delete("/v1/tasks/reviews").status_code == 204
            create_with_examples(api)
            return saved

        monkeypatch.setattr(Estimator, "save", save_then_recreate)
        assert Worker(client, artifacts, max_length=48).run_once(block_ms=100) == job_id

        record = api.get(f"/v1/jobs/{job_id}").json()
        assert record["state"] == "cancelled" and record["published"] is None, record
        assert current_checkpoint(client, "reviews") is None and client.xlen(checkpoints_key("reviews")) == 0
        assert written and not written[0].exists()  # the refused checkpoint is not left on disk
        served = api.post("/v1/tasks/reviews/classify", json={"texts": ["great fun"]}).json()
        assert served["model_version"] == "base"
        assert JobQueue(client).claim("worker-2", block_ms=100, min_idle_ms=0) is None  # acknowledged


def test_a_job_cancelled_while_it_trains_stops_at_its_next_step(server, causal_dir, tmp_path) -> None:
    client = redis.Redis.from_url(server.url)
    artifacts = tmp_path / "data" / "artifacts"
    with api_client(server, causal_dir, tmp_path) as api:
        create_with_examples(api)
        job_id = api.post("/v1/tasks/reviews/train", json={**TRAIN, "steps": 50}).json()["id"]
        steps: list[float] = []

        class DeletingWorker(Worker):
            def _report(self, job, **fields):
                if "progress" in fields:  # a step's report (stage reports come before the first)
                    steps.append(fields["progress"])
                    if len(steps) == 1:
                        assert api.delete("/v1/tasks/reviews").status_code == 204
                super()._report(job, **fields)

        assert DeletingWorker(client, artifacts, max_length=48).run_once(block_ms=100) == job_id
        assert steps == [1 / 50]  # it stopped at its first step instead of training on
        assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
        assert not (artifacts / "reviews").exists()


def test_deleting_a_task_removes_its_automatic_training_state(server, causal_dir, tmp_path) -> None:
    client = redis.Redis.from_url(server.url)
    auto = {**TASK, "training": {"auto": True, "every": len(EXAMPLES), **TRAIN}}
    log, state = ExampleLog(client, "reviews"), autotrain_key("reviews")
    with api_client(server, causal_dir, tmp_path) as api:
        assert api.post("/v1/tasks", json=auto).status_code == 201
        assert api.post("/v1/tasks/reviews/examples", json={"examples": EXAMPLES}).status_code == 201
        (job,) = api.get("/v1/tasks/reviews/jobs").json()
        assert job["trigger"] == "auto" and client.exists(log.added_key, state) == 2

        assert api.delete("/v1/tasks/reviews").status_code == 204
        assert client.exists(log.added_key, state) == 0
        assert api.get(f"/v1/jobs/{job['id']}").json()["state"] == "cancelled"

        # Created again, the task counts from nothing: one example short of `every` queues nothing.
        assert api.post("/v1/tasks", json=auto).status_code == 201
        examples = {"examples": EXAMPLES[:-1]}
        assert api.post("/v1/tasks/reviews/examples", json=examples).status_code == 201
        assert api.get("/v1/tasks/reviews/jobs").json() == []


def test_another_replica_does_not_serve_a_deleted_task_recreated_under_the_same_spec(
    server, causal_dir, tmp_path
) -> None:
    # Replica B has the task loaded; replica A deletes it and creates it again with the very same spec.
    # B must serve the new task (an empty store), not its memory of the old one.
    with api_client(server, causal_dir, tmp_path) as a, api_client(server, causal_dir, tmp_path) as b:
        create_with_examples(a)
        before = b.post(
            "/v1/tasks/reviews/classify", json={"texts": ["great fun"], "neighbours": True}
        ).json()
        assert before["predictions"][0]["neighbours"]  # B holds the old examples
        assert a.delete("/v1/tasks/reviews").status_code == 204
        assert a.post("/v1/tasks", json=TASK).status_code == 201
        after = b.post("/v1/tasks/reviews/classify", json={"texts": ["great fun"], "neighbours": True})
        assert after.status_code == 200
        assert after.json()["predictions"][0]["neighbours"] == []  # nothing of the deleted task
        assert b.get("/v1/tasks/reviews/examples").json()["examples"] == []


def test_classify_serves_from_the_cache_and_never_serves_a_task_changed_or_deleted_elsewhere(
    server, causal_dir, tmp_path
) -> None:
    # B answers classify with the runtime it cached, with no lookup of its own per request: the
    # micro-batch checks the task once. A change made on A is seen by B's next classify all the same.
    with api_client(server, causal_dir, tmp_path) as a, api_client(server, causal_dir, tmp_path) as b:
        create_with_examples(a)
        runtimes = b.app.state.runtimes
        lookups: list[str] = []
        look_up = runtimes.runtime
        runtimes.runtime = lambda name: (lookups.append(name), look_up(name))[1]
        classify = lambda: b.post("/v1/tasks/reviews/classify", json={"texts": ["great fun"]})  # noqa: E731
        assert classify().status_code == 200 and lookups == ["reviews"]  # built on first use
        for _ in range(3):
            assert classify().status_code == 200
        assert lookups == ["reviews"]

        patched = a.patch("/v1/tasks/reviews", json={"training": {"auto": True, "every": 50}})
        assert patched.status_code == 200
        assert classify().status_code == 200 and lookups == ["reviews"] * 2  # the batch saw the change
        assert b.get("/v1/tasks/reviews").json()["training"]["every"] == 50

        assert a.delete("/v1/tasks/reviews").status_code == 204
        gone = classify()
        assert gone.status_code == 404 and "reviews" in gone.json()["detail"]
