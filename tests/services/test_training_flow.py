"""Train through the bus: a job, the worker, a published checkpoint, and the api swapping it in."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.settings import Settings
from services.bus.jobs import Job, JobQueue
from services.bus.keys import TASKS_KEY
from services.bus.server import EmbeddedRedis
from services.bus.versions import Published, current_checkpoint, publish_checkpoint
from services.engine.task_spec import Task
from services.trainer.worker import Worker
from tests.services.harness import TRAINING_EXAMPLES, wait_for

TASK = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
EXAMPLES = TRAINING_EXAMPLES
TRAIN = {"method": "retroprompt", "steps": 4, "batch_size": 4, "lr": 1e-3, "eval_every": 2}


@pytest.fixture()
def server(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


@contextmanager
def _api_with_examples(server, causal_dir):
    """The api on a tiny backbone, with the task `reviews` and its labelled EXAMPLES posted.

    Forwards of at most 5 texts (OPENBOOK_BATCH_MAX_TEXTS): the task's classifier runs its chunks so too.
    """
    settings = Settings(
        redis_url=server.url, default_backbone=str(causal_dir), max_length=48, batch_max_texts=5
    )
    with TestClient(create_app(settings)) as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        body = {"examples": [{"text": t, "label": label} for t, label in EXAMPLES]}
        assert api.post("/v1/tasks/reviews/examples", json=body).status_code == 201
        yield api


def test_trained_checkpoint_is_swapped_in_without_failed_requests(server, causal_dir, tmp_path) -> None:
    with _api_with_examples(server, causal_dir) as api:
        before = api.post("/v1/tasks/reviews/classify", json={"texts": ["fun film"]}).json()
        assert before["model_version"] == "base"
        assert api.app.state.runtimes.loaded["reviews"].classifier.batch_size == 5

        job = api.post("/v1/tasks/reviews/train", json=TRAIN)
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "queued"

        responses: list = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                responses.append(api.post("/v1/tasks/reviews/classify", json={"texts": ["fun film", "dull"]}))

        clients = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in clients:
            thread.start()
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job_id
        record = api.get(f"/v1/jobs/{job_id}").json()
        assert record["state"] == "succeeded", record
        version = record["published"]["version"]
        wait_for(
            lambda: (
                api.post("/v1/tasks/reviews/classify", json={"texts": ["x"]}).json()["model_version"]
                == version
            )
        )
        stop.set()
        for thread in clients:
            thread.join()

        assert responses and all(r.status_code == 200 for r in responses)  # no failed request
        assert {r.json()["model_version"] for r in responses} <= {"base", version}
        after = api.post(
            "/v1/tasks/reviews/classify", json={"texts": ["fun film"], "neighbours": True}
        ).json()
        runtime = api.app.state.runtimes.loaded["reviews"]
        assert after["model_version"] == version and len(runtime.classifier.store) == len(EXAMPLES)
        assert runtime.classifier.batch_size == 5  # the swapped-in classifier chunks as the batcher does
        assert after["predictions"][0]["neighbours"]  # the re-embedded store answers
        assert record["progress"] == 1.0 and record["metrics"]["train"] + record["metrics"]["dev"] == len(
            EXAMPLES
        )
        assert record["stage"] == "judging"  # the last stage it reached
        assert record["created"] < record["stage_since"] <= time.time()  # and when it began

        # An example posted after training is replayed into the new store, not lost by the swap.
        api.post(
            "/v1/tasks/reviews/examples", json={"examples": [{"text": "lovely", "label": "1", "id": 99}]}
        )
        ids = [
            n["id"]
            for n in api.post(
                "/v1/tasks/reviews/classify", json={"texts": ["lovely"], "neighbours": True}
            ).json()["predictions"][0]["neighbours"]
        ]
        assert ids[0] == 99

        # A corrupt artifact is refused and the trained version keeps serving.
        client = redis.Redis.from_url(server.url)
        good = current_checkpoint(client, "reviews")
        assert good is not None and good.version == version
        bad = Published("corrupt", good.path, "0" * 64, good.log_offset)
        publish_checkpoint(client, Job("by-hand", "reviews", "retroprompt", {}), bad)
        wait_for(lambda: api.app.state.runtimes.loaded["reviews"].swap_error)
        assert (
            api.post("/v1/tasks/reviews/classify", json={"texts": ["x"]}).json()["model_version"] == version
        )


def test_textual_demonstrations_read_the_examples_texts_after_the_swap(server, causal_dir, tmp_path) -> None:
    with _api_with_examples(server, causal_dir) as api:
        job = api.post("/v1/tasks/reviews/train", json={**TRAIN, "method": "retroprompt/demos=text"})
        assert job.status_code == 202, job.text
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job.json()["id"]
        record = api.get(f"/v1/jobs/{job.json()['id']}").json()
        assert record["state"] == "succeeded", record
        version = record["published"]["version"]
        wait_for(lambda: api.app.state.runtimes.loaded["reviews"].model_version == version)
        body = {"examples": [{"text": "lovely", "label": "1", "id": 99}]}  # replayed after the swap
        assert api.post("/v1/tasks/reviews/examples", json=body).status_code == 201
        answer = api.post("/v1/tasks/reviews/classify", json={"texts": ["fun film"]})
        assert answer.status_code == 200 and answer.json()["model_version"] == version
        runtime = api.app.state.runtimes.loaded["reviews"]
        store = runtime.classifier.store
        assert runtime.classifier.demos is not None and runtime.classifier.demos.mode == "text"
        assert dict(zip(store.ids().tolist(), store.texts_of(store.ids()), strict=True)) == runtime.texts


def test_a_job_that_cannot_train_fails_with_a_reason(server, causal_dir, tmp_path) -> None:
    settings = Settings(redis_url=server.url, default_backbone=str(causal_dir), max_length=48)
    with TestClient(create_app(settings)) as api:
        api.post("/v1/tasks", json=TASK)
        # examples of one label only: there is nothing to tell apart
        examples = [{"text": "good", "label": "1", "id": 1}, {"text": "fine", "label": "1", "id": 9}]
        api.post("/v1/tasks/reviews/examples", json={"examples": examples})
        assert api.post("/v1/tasks/reviews/train", json={**TRAIN, "method": "nope"}).status_code == 422
        job_id = api.post("/v1/tasks/reviews/train", json=TRAIN).json()["id"]
        Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts").run_once(block_ms=100)
        record = api.get(f"/v1/jobs/{job_id}").json()
        assert record["state"] == "failed" and "at least 2 labels" in record["error"]
        assert record["stage"] is None  # it failed before preparing anything
        assert not (tmp_path / "artifacts" / "reviews").exists()
        assert api.get("/v1/jobs/nope").status_code == 404
        assert 'openbook_jobs{state="failed"} 1.0' in api.get("/metrics").text


def seeded_queue(server) -> tuple[redis.Redis, JobQueue]:
    """A queue on a server that knows the task `reviews` (jobs are only taken for an existing task)."""
    client = redis.Redis.from_url(server.url)
    client.hset(TASKS_KEY, "reviews", Task(**TASK, backbone="tiny").model_dump_json())
    return client, JobQueue(client)


def test_a_crashed_workers_job_is_claimed_by_another(server) -> None:
    _, queue = seeded_queue(server)
    job_id = queue.submit("reviews", "prompt-ft", {"steps": 1})
    first = queue.claim("worker-a", block_ms=100)
    assert first is not None and first[1].id == job_id  # worker-a dies without XACK
    assert queue.claim("worker-b", block_ms=100, min_idle_ms=60_000) is None  # not idle long enough
    taken = queue.claim("worker-b", block_ms=100, min_idle_ms=0)
    assert taken is not None and taken[1].id == job_id
    assert not queue.ack(first[0], "worker-a")  # no longer worker-a's to acknowledge
    assert queue.ack(taken[0], "worker-b")
    assert queue.claim("worker-c", block_ms=100, min_idle_ms=0) is None


def test_a_stopped_worker_leaves_its_job_for_another(server, causal_dir, tmp_path) -> None:
    # A stop request during training ends the job at the next step without acknowledging it, queued
    # again: another worker takes it over at once, without waiting out XAUTOCLAIM's idle time.
    with _api_with_examples(server, causal_dir) as api:
        job_id = api.post("/v1/tasks/reviews/train", json=TRAIN).json()["id"]

        stopping = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        stopping.stop = threading.Event()
        stopping.stop.set()  # asked to stop before its first step
        assert stopping.run_once(block_ms=100) == job_id
        record = api.get(f"/v1/jobs/{job_id}").json()
        assert record["state"] == "queued" and "interrupted" in record["error"]
        assert current_checkpoint(redis.Redis.from_url(server.url), "reviews") is None  # nothing published

        taking_over = Worker(
            redis.Redis.from_url(server.url), tmp_path / "artifacts", consumer="worker-2", max_length=48
        )
        claimed = taking_over.queue.claim("worker-2", block_ms=100)
        assert claimed is not None and claimed[1].id == job_id  # still pending: not acknowledged


def test_a_restarted_worker_takes_its_own_job_back_at_once(server) -> None:
    _, queue = seeded_queue(server)
    job_id = queue.submit("reviews", "prompt-ft", {"steps": 1})
    assert queue.claim("worker-1", block_ms=100) is not None  # worker-1 dies without XACK
    # Restarted under its name, it resumes the job now, not after the idle time of a minute.
    again = queue.claim("worker-1", block_ms=100)
    assert again is not None and again[1].id == job_id
    assert queue.get(job_id)["state"] == "running"


def test_a_dead_workers_job_is_queued_again_at_once(server) -> None:
    from services.bus.workers import worker_died

    client, queue = seeded_queue(server)
    job_id = queue.submit("reviews", "prompt-ft", {"steps": 1})
    assert queue.claim("worker-a", block_ms=100) is not None
    assert queue.get(job_id)["state"] == "running"
    assert queue.report(job_id, "worker-a", progress=0.5, stage="training", stage_since=time.time())
    assert worker_died(client, "worker-a", "its worker was killed by SIGKILL") == [job_id]
    record = queue.get(job_id)
    assert record["state"] == "queued" and record["progress"] == 0.0 and "SIGKILL" in record["error"]
    assert "stage" not in record and "stage_since" not in record  # queued again, it has not begun any
    taken = queue.claim("worker-b", block_ms=100)  # with the default idle time of a minute
    assert taken is not None and taken[1].id == job_id
    assert queue.get(job_id)["state"] == "running" and queue.get(job_id)["worker"] == "worker-b"


def test_a_finished_job_whose_ack_was_lost_is_not_run_again(server) -> None:
    _, queue = seeded_queue(server)
    job_id = queue.submit("reviews", "prompt-ft", {"steps": 1})
    assert queue.claim("worker-a", block_ms=100) is not None
    queue.update(job_id, state="succeeded", progress=1.0)  # ... and the worker dies before XACK
    assert queue.claim("worker-a", block_ms=100) is None
    assert queue.claim("worker-b", block_ms=100, min_idle_ms=0) is None
    assert queue.get(job_id)["state"] == "succeeded"


def test_a_live_workers_heartbeat_keeps_its_job_and_says_it_is_alive(server, tmp_path) -> None:
    from services.bus.workers import live_workers

    client, queue = seeded_queue(server)
    job_id = queue.submit("reviews", "prompt-ft", {"steps": 1})
    worker = Worker(client, tmp_path / "artifacts", consumer="worker-a")
    worker.current = queue.claim("worker-a", block_ms=100)  # what run_once holds while it trains
    time.sleep(0.3)
    worker.heartbeat()
    # A long job is not idle while its worker lives: nobody takes it over.
    assert queue.claim("worker-b", block_ms=100, min_idle_ms=250) is None
    assert [(w["name"], w["job"]) for w in live_workers(client)] == [("worker-a", job_id)]


def test_a_worker_sweeps_staging_left_by_a_crash_but_not_a_live_writers(server, tmp_path) -> None:
    from services.trainer.staging import writing

    artifacts = tmp_path / "artifacts"
    stale = artifacts / "reviews" / f".20250101-000000-abcdef12.tmp-{'a' * 32}"
    stale.mkdir(parents=True)
    (stale / "weights.safetensors").write_bytes(b"0" * 4096)
    published = artifacts / "reviews" / "20250101-000000-abcdef12"
    published.mkdir()
    (published / "manifest.json").write_text("{}")
    held = artifacts / "other" / f".20250101-000001-12345678.tmp-{'b' * 32}"
    held.mkdir(parents=True)
    stop = threading.Event()
    stop.set()  # start up, then stop at once
    with writing(artifacts, "other"):  # a live writer is putting task `other`'s checkpoint together
        Worker(redis.Redis.from_url(server.url), artifacts).run_forever(stop)
    assert not stale.exists() and published.exists() and held.exists()
