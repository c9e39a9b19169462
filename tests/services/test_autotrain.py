"""Automatic training over a real embedded Redis: when it fires, how it coalesces, the settings' PATCH."""

from __future__ import annotations

import threading

import pytest
import redis
from fastapi.testclient import TestClient

from services.bus.deletion import delete_task
from services.bus.examples_log import ExampleLog, NewExample
from services.bus.jobs import JOBS_STREAM, JobQueue, task_jobs_key
from services.bus.keys import TASKS_KEY, autotrain_key
from services.bus.workers import worker_died
from services.engine.autotrain import queue_if_due, update_training
from services.engine.task_spec import Task, TrainingSettings
from services.trainer.worker import Worker
from tests.services.harness import TASK, wait_for

KNOBS = {"steps": 2, "batch_size": 4, "lr": 1e-3, "eval_every": 2, "patience": 2}
AUTO_TASK = {**TASK, "training": {"auto": True, "every": 4, **KNOBS}}
EXAMPLES = "/v1/tasks/reviews/examples"
JOBS = "/v1/tasks/reviews/jobs"


def examples(ids: range) -> list[dict]:
    return [{"text": f"a {('bad', 'good')[i % 2]} film {i}", "label": str(i % 2), "id": i} for i in ids]


def post(api: TestClient, ids: range) -> None:
    response = api.post(EXAMPLES, json={"examples": examples(ids)})
    assert response.status_code == 201, response.text


def jobs(api: TestClient, **params) -> list[dict]:
    response = api.get(JOBS, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def finish(client: redis.Redis, job_id: str) -> None:
    """Run a job through the queue's state machine to `succeeded`, as a worker would, without training."""
    queue = JobQueue(client)
    entry_id, job = queue.claim("worker-t", block_ms=100)
    assert job.id == job_id
    assert queue.report(job_id, "worker-t", state="succeeded", progress=1.0)
    queue.ack(entry_id, "worker-t")


@pytest.fixture()
def api(make_client):
    with make_client() as client:
        assert client.post("/v1/tasks", json=AUTO_TASK).status_code == 201
        yield client


def test_a_job_is_queued_once_every_examples_were_added(api: TestClient) -> None:
    for i in range(3):
        post(api, range(i, i + 1))
    assert jobs(api) == []  # every - 1 examples: nothing yet
    post(api, range(3, 4))
    (job,) = jobs(api)
    assert job["trigger"] == "auto" and job["state"] == "queued" and job["method"] == "retroprompt"
    assert job["train_config"] == {**KNOBS, "keep": "last"}  # a service job's kept weights, spelled out
    post(api, range(3, 4))  # a retried POST adds nothing and queues nothing
    api.delete(f"{EXAMPLES}/0")
    assert [j["id"] for j in jobs(api)] == [job["id"]]


def test_growth_while_a_job_waits_coalesces_into_one_next_job(api: TestClient, server, tmp_path) -> None:
    post(api, range(4))
    (first,) = jobs(api)
    post(api, range(4, 16))  # 3 x every while the first is queued
    assert [j["id"] for j in jobs(api)] == [first["id"]]

    worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
    assert worker.run_once(block_ms=100) == first["id"]  # trains, then finds the growth due
    second, done = jobs(api)
    assert done["id"] == first["id"] and done["state"] == "succeeded", done
    assert second["trigger"] == "auto" and second["state"] == "queued"
    assert second["created"] >= done["created"]

    assert worker.run_once(block_ms=100) == second["id"]
    assert len(jobs(api)) == 2  # nothing was added since the second was queued: no third


def test_manual_jobs_neither_block_nor_count_as_automatic_ones(api: TestClient, server) -> None:
    post(api, range(4))
    (auto,) = jobs(api)
    manual = api.post("/v1/tasks/reviews/train", json=KNOBS)
    assert manual.status_code == 202 and manual.json()["trigger"] == "manual"
    assert [j["trigger"] for j in jobs(api)] == ["manual", "auto"]

    finish(redis.Redis.from_url(server.url), auto["id"])  # the manual job still waits
    post(api, range(4, 8))
    newest = jobs(api)[0]
    assert newest["trigger"] == "auto" and newest["id"] != auto["id"] and len(jobs(api)) == 3


def test_the_jobs_list_is_newest_first_and_bounded(api: TestClient) -> None:
    ids = [api.post("/v1/tasks/reviews/train", json=KNOBS).json()["id"] for _ in range(3)]
    assert [j["id"] for j in jobs(api)] == ids[::-1]
    assert [j["id"] for j in jobs(api, limit=2)] == ids[:0:-1]
    assert api.get(JOBS, params={"limit": 201}).status_code == 422
    assert api.get(JOBS, params={"limit": 0}).status_code == 422
    assert api.get("/v1/tasks/nope/jobs").status_code == 404


BAD_PATCHES = [
    ({"training": {"every": 0}}, ["body", "training", "every"]),
    ({"training": {"method": "no-such-method"}}, ["body", "training", "method"]),
    ({"training": {"steps": 0}}, ["body", "training", "steps"]),
    ({"training": {"epochs": 0}}, ["body", "training", "epochs"]),
    ({"training": {"epochs": 1001}}, ["body", "training", "epochs"]),
    ({"training": {"epochs": "NaN"}}, ["body", "training", "epochs"]),
    ({"training": {"max_steps": 0}}, ["body", "training", "max_steps"]),
    ({"training": {"epochs": 8, "min_steps": 0}}, ["body", "training", "min_steps"]),
    ({"training": {"steps": 4, "min_steps": 8}}, ["body", "training"]),  # a floor is an epoch budget's
    ({"training": {"eval_every": 0}}, ["body", "training", "eval_every"]),
    ({"training": {"steps": 4, "epochs": 2}}, ["body", "training"]),  # two budgets at once
    ({"training": {"lr": 1.5}}, ["body", "training", "lr"]),
    ({"training": {"batch_size": 2000}}, ["body", "training", "batch_size"]),
    ({"training": {"few_dev_lam": 1.5}}, ["body", "training", "few_dev_lam"]),
    ({"training": {"auto": None}}, ["body", "training", "auto"]),
    ({"training": {"auto": 1}}, ["body", "training", "auto"]),  # a JSON boolean, as the schema says
    ({"training": {"eval_every": True}}, ["body", "training", "eval_every"]),  # ... and numbers, numbers
    ({"training": {"every": False}}, ["body", "training", "every"]),
    ({"refuse_out_of_scope": 0}, ["body", "refuse_out_of_scope"]),
    ({"training": {"bogus": 1}}, ["body", "training", "bogus"]),
    ({"training": {"precision": "float16"}}, ["body", "training", "precision"]),
    ({"training": {"every": 4}, "template": "{text} {mask}"}, ["body", "template"]),
    ({"name": "reviews"}, ["body", "name"]),
    ({}, ["body"]),  # nothing to change
]


@pytest.mark.parametrize(("body", "loc"), BAD_PATCHES)
def test_a_bad_patch_is_refused_and_changes_nothing(api: TestClient, server, body: dict, loc: list) -> None:
    client = redis.Redis.from_url(server.url)
    stored = client.hget(TASKS_KEY, "reviews")
    response = api.patch("/v1/tasks/reviews", json=body)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]
    assert client.hget(TASKS_KEY, "reviews") == stored  # byte for byte


def test_a_patch_merges_the_keys_given_over_the_stored_ones(api: TestClient) -> None:
    response = api.patch("/v1/tasks/reviews", json={"training": {"every": 9, "method": "prompt-ft"}})
    assert response.status_code == 200, response.text
    unset = {"epochs": None, "max_steps": None, "min_steps": None, "precision": "float32", "keep": "last"}
    unset["few_dev_lam"] = None
    expected = {**AUTO_TASK["training"], **unset, "every": 9, "method": "prompt-ft"}
    assert response.json()["training"] == expected and response.json()["template"] == TASK["template"]
    assert api.get("/v1/tasks/reviews").json()["training"] == expected
    assert api.patch("/v1/tasks/nope", json={"training": {"every": 2}}).status_code == 404
    bad = {**TASK, "name": "other", "training": {"method": "no-such-method"}}
    created = api.post("/v1/tasks", json=bad)
    assert created.status_code == 422 and created.json()["detail"][0]["loc"] == ["body", "training", "method"]


def test_turning_auto_on_trains_on_the_examples_already_there(make_client) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json={**TASK, "training": {"auto": False}}).status_code == 201
        post(api, range(20))
        assert jobs(api) == []  # turned off
        patched = api.patch("/v1/tasks/reviews", json={"training": {"auto": True, "every": 8}})
        assert patched.status_code == 200
        (job,) = jobs(api)
        assert job["trigger"] == "auto"


def test_a_patch_keeps_the_served_checkpoint(make_client, server, tmp_path) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        post(api, range(8))
        job_id = api.post("/v1/tasks/reviews/train", json=KNOBS).json()["id"]
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job_id
        version = api.get(f"/v1/jobs/{job_id}").json()["published"]["version"]

        def served() -> str:
            return api.post("/v1/tasks/reviews/classify", json={"texts": ["fine"]}).json()["model_version"]

        wait_for(lambda: served() == version)
        runtime = api.app.state.runtimes.loaded["reviews"]
        classifier = runtime.classifier
        patched = api.patch("/v1/tasks/reviews", json={"training": {"auto": True, "every": 50}})
        assert patched.status_code == 200
        assert served() == version
        assert api.get("/v1/tasks/reviews").json()["training"]["auto"] is True
        kept = api.app.state.runtimes.loaded["reviews"]
        assert kept is runtime and kept.classifier is classifier and kept.task.training.every == 50


def test_a_patch_that_gives_a_budget_replaces_the_stored_one(api: TestClient) -> None:
    assert api.get("/v1/tasks/reviews").json()["training"]["steps"] == KNOBS["steps"]
    patched = api.patch("/v1/tasks/reviews", json={"training": {"epochs": 2.5}})
    assert patched.status_code == 200, patched.text
    assert (patched.json()["training"]["steps"], patched.json()["training"]["epochs"]) == (None, 2.5)
    patched = api.patch("/v1/tasks/reviews", json={"training": {"epochs": 20, "max_steps": 50}})
    assert patched.status_code == 200, patched.text
    patched = api.patch("/v1/tasks/reviews", json={"training": {"max_steps": 60}})  # the cap alone
    assert (patched.json()["training"]["epochs"], patched.json()["training"]["max_steps"]) == (20, 60)
    # a floor is given with the epochs it is the floor of: it is part of the budget
    assert api.patch("/v1/tasks/reviews", json={"training": {"min_steps": 32}}).status_code == 422
    patched = api.patch("/v1/tasks/reviews", json={"training": {"epochs": 8, "min_steps": 32}})
    assert patched.status_code == 200, patched.text
    assert [patched.json()["training"][key] for key in ("epochs", "max_steps", "min_steps")] == [8, None, 32]
    patched = api.patch("/v1/tasks/reviews", json={"training": {"steps": 6}})  # cap and floor go with it
    training = patched.json()["training"]
    assert (training["steps"], training["epochs"], training["max_steps"], training["min_steps"]) == (
        6,
        *[None] * 3,
    )


def test_a_job_trains_for_the_budget_it_was_given(api: TestClient, server) -> None:
    from openbook.train_config import DEFAULT_MAX_STEPS, TrainConfig

    # the task's own knobs put back to the defaults: what a job leaves out it takes from the task (below)
    defaults = {key: TrainingSettings().model_dump()[key] for key in KNOBS}
    assert api.patch("/v1/tasks/reviews", json={"training": defaults}).status_code == 200
    by_epochs = api.post("/v1/tasks/reviews/train", json={**KNOBS, "steps": None, "epochs": 3})
    assert by_epochs.status_code == 202, by_epochs.text
    config = by_epochs.json()["train_config"]
    assert "steps" not in config and TrainConfig(**config).total_steps(10) == 9  # 3 epochs of ceil(10 / 4)
    default = api.post("/v1/tasks/reviews/train", json={}).json()["train_config"]
    assert "steps" not in default and default == default | TrainConfig().budget()  # the default, spelled out
    epochs = api.post("/v1/tasks/reviews/train", json={"epochs": 20}).json()["train_config"]
    # the cap spelled out, no eval_every: a dev check every epoch
    assert (epochs["epochs"], epochs["max_steps"], "eval_every" in epochs) == (20, DEFAULT_MAX_STEPS, False)
    assert TrainConfig(**epochs).check_every(12) == 2
    assert "precision" not in default  # float32, written only when another is asked for
    mixed = api.post("/v1/tasks/reviews/train", json={"precision": "bfloat16"}).json()["train_config"]
    assert TrainConfig(**mixed).precision == "bfloat16"  # as the worker will build it
    # a job keeps its last weights unless asked for the best, and its record says which either way
    assert default["keep"] == TrainConfig(**default).keep == "last"
    best = api.post("/v1/tasks/reviews/train", json={"keep": "best"}).json()["train_config"]
    assert best["keep"] == TrainConfig(**best).keep == "best"
    refused = api.post("/v1/tasks/reviews/train", json={"keep": "first"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "keep"
    floored = api.post("/v1/tasks/reviews/train", json={"epochs": 2, "min_steps": 12}).json()["train_config"]
    assert floored["min_steps"] == 12 and TrainConfig(**floored).total_steps(10) == 12  # 2 x 3 steps, floored

    client = redis.Redis.from_url(server.url)
    queued = client.xlen(JOBS_STREAM)
    for bad in ({"steps": 4, "epochs": 2}, {"epochs": 0}, {"epochs": -1}, {"epochs": 1e9}, {"min_steps": 8}):
        response = api.post("/v1/tasks/reviews/train", json=bad)
        assert response.status_code == 422, (bad, response.text)
    assert client.xlen(JOBS_STREAM) == queued and len(jobs(api)) == 6  # nothing was queued
    refused = api.post("/v1/tasks/reviews/train", json={"steps": 4, "epochs": 2}).json()["detail"]
    assert "steps or as epochs, not both" in refused[0]["msg"]


def test_a_job_started_by_hand_takes_what_it_leaves_out_from_the_task(api: TestClient) -> None:
    def job(body: dict) -> dict:
        response = api.post("/v1/tasks/reviews/train", json=body)
        assert response.status_code == 202, response.text
        return response.json()

    task = api.get("/v1/tasks/reviews").json()
    plain = job({})  # the budget and knobs the task's automatic jobs train with, and its method
    assert {key: plain["train_config"][key] for key in KNOBS} == KNOBS
    assert plain["method"] == task["method"]
    faster = job({"lr": 0.01})["train_config"]  # a knob given replaces the task's, the others stay
    assert (faster["lr"], faster["steps"], faster["batch_size"]) == (
        0.01,
        KNOBS["steps"],
        KNOBS["batch_size"],
    )
    by_epochs = job({"epochs": 3})["train_config"]  # a budget given replaces the task's
    assert "steps" not in by_epochs and (by_epochs["epochs"], by_epochs["batch_size"]) == (
        3,
        KNOBS["batch_size"],
    )
    assert api.patch("/v1/tasks/reviews", json={"training": {"method": "prompt-ft"}}).status_code == 200
    assert job({})["method"] == "prompt-ft"  # the task's training method, unless the job names one
    assert job({"method": "retroprompt"})["method"] == "retroprompt"


def test_a_spec_stored_without_training_reads_with_the_defaults(make_client, server, causal_dir) -> None:
    client = redis.Redis.from_url(server.url)
    old = Task(**TASK, backbone=str(causal_dir)).model_dump_json(exclude={"training"})
    client.hset(TASKS_KEY, "reviews", old)
    with make_client() as api:
        response = api.get("/v1/tasks/reviews")
        assert response.status_code == 200 and response.json()["training"] == TrainingSettings().model_dump()
        post(api, range(40))
        # it trains by itself, as a new task does: one job once `every` examples are in, the rest
        # coalescing into the next while it waits
        assert [job["trigger"] for job in jobs(api)] == ["auto"]
    assert client.hget(TASKS_KEY, "reviews") == old.encode()  # read, never rewritten


def seeded(server, every: int = 2) -> tuple[redis.Redis, ExampleLog]:
    """A bus that knows the task `reviews`, training automatically every `every` examples."""
    client = redis.Redis.from_url(server.url)
    training = TrainingSettings(auto=True, every=every, **KNOBS)
    client.hset(TASKS_KEY, "reviews", Task(**TASK, backbone="tiny", training=training).model_dump_json())
    return client, ExampleLog(client, "reviews")


def add(log: ExampleLog, ids: range) -> None:
    log.append([NewExample(f"film {i}", str(i % 2), i) for i in ids])


def trigger_at_once(url: str, task: str, callers: int) -> list[str | None]:
    """`queue_if_due` from `callers` threads (a client each, as replicas have), released together."""
    start = threading.Barrier(callers)
    queued: list[str | None] = []

    def trigger() -> None:
        client = redis.Redis.from_url(url)
        start.wait()
        queued.append(queue_if_due(client, task))

    threads = [threading.Thread(target=trigger) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return queued


def test_replicas_triggering_at_once_queue_one_job(server) -> None:
    client, log = seeded(server)
    for round_ in range(4):
        add(log, range(2 * round_, 2 * round_ + 2))
        made = [job_id for job_id in trigger_at_once(server.url, "reviews", 8) if job_id is not None]
        assert len(made) == 1 and client.scard(task_jobs_key("reviews")) == round_ + 1
        finish(client, made[0])
    assert client.hget(autotrain_key("reviews"), "position") == b"8"


def test_a_killed_workers_automatic_job_is_claimed_again_not_copied(server) -> None:
    client, log = seeded(server)
    add(log, range(2))
    job_id = queue_if_due(client, "reviews")
    queue = JobQueue(client)
    assert job_id is not None and queue.claim("worker-a", block_ms=100)[1].id == job_id
    assert worker_died(client, "worker-a", "its worker was killed") == [job_id]
    add(log, range(2, 8))
    assert queue_if_due(client, "reviews") is None  # the released job is still the task's automatic one
    taken = queue.claim("worker-b", block_ms=100)
    assert taken is not None and taken[1].id == job_id and client.scard(task_jobs_key("reviews")) == 1


def test_an_update_lands_on_the_task_it_read_or_nowhere(server, tmp_path) -> None:
    client, _ = seeded(server)
    created = client.hget(TASKS_KEY, "reviews")

    def recreate(task: Task) -> None:  # the task is deleted and created again while the update runs
        delete_task(client, "reviews", tmp_path / "artifacts")
        client.hset(TASKS_KEY, "reviews", created)

    assert update_training(client, "reviews", {"every": 9}, recreate) is None
    assert client.hget(TASKS_KEY, "reviews") == created  # the new task's spec is untouched

    raced: list[Task] = []

    def race(task: Task) -> None:  # another update lands first: this one is merged over it
        if not raced:
            raced.append(task)
            stored = Task.model_validate_json(client.hget(TASKS_KEY, "reviews"))
            changed = stored.model_copy(update={"training": stored.training.model_copy(update={"steps": 7})})
            client.hset(TASKS_KEY, "reviews", changed.model_dump_json())

    updated = update_training(client, "reviews", {"every": 9}, race)
    assert updated is not None and (updated.training.every, updated.training.steps) == (9, 7)
    assert Task.model_validate_json(client.hget(TASKS_KEY, "reviews")) == updated
