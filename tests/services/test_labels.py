"""Labels added to and removed from a live task, on the real embedded Redis, a worker and two replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.bus.examples_log import ExampleLog, NewExample, UnknownLabel
from services.bus.keys import TASKS_KEY
from services.bus.task_labels import swap_spec
from services.engine.task_spec import Task
from services.trainer.worker import Worker
from tests.services.harness import TASK, api_settings, wait_for

EXAMPLES = [
    ("the movie was great and fun", "1"),
    ("a good film with a great cast", "1"),
    ("it was terrible and boring", "0"),
    ("a bad film , it was awful", "0"),
]
TRAIN = {"method": "retroprompt", "steps": 2, "batch_size": 4, "lr": 1e-3, "eval_every": 2}
QUESTION = "what is the answer to this question"


def classify(api: TestClient, text: str) -> dict:
    response = api.post("/v1/tasks/reviews/classify", json={"texts": [text], "neighbours": True})
    assert response.status_code == 200, response.text
    return response.json()


def train(api: TestClient, server, artifacts: Path) -> str:
    """Train and serve the result: `force` skips the promotion gate, which these tests do not judge."""
    job_id = api.post("/v1/tasks/reviews/train", json={**TRAIN, "force": True}).json()["id"]
    assert Worker(redis.Redis.from_url(server.url), artifacts, max_length=48).run_once(block_ms=100) == job_id
    record = api.get(f"/v1/jobs/{job_id}").json()
    assert record["state"] == "succeeded", record
    return record["published"]["version"]


def test_a_label_added_to_a_trained_task_is_served_at_once_everywhere_and_trained_next(
    server, causal_dir: Path, tmp_path: Path
) -> None:
    settings = api_settings(server.url, causal_dir)
    with TestClient(create_app(settings)) as api, TestClient(create_app(settings)) as replica:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        body = {"examples": [{"text": t, "label": label, "id": i} for i, (t, label) in enumerate(EXAMPLES)]}
        assert api.post("/v1/tasks/reviews/examples", json=body).status_code == 201
        version = train(api, server, tmp_path / "artifacts")
        for app in (api, replica):
            wait_for(lambda app=app: classify(app, "fun")["model_version"] == version)

        runtime = api.app.state.runtimes.loaded["reviews"]
        classifier_before = runtime.classifier
        added = api.post("/v1/tasks/reviews/labels", json={"label": "2", "word": "what"})
        assert added.status_code == 201, added.text
        assert added.json()["labels"] == {"0": "bad", "1": "good", "2": "what"}
        assert api.get("/v1/tasks/reviews").json()["labels"] == added.json()["labels"]
        # grown in place: the same runtime and store, no reload of the checkpoint
        assert api.app.state.runtimes.loaded["reviews"] is runtime
        assert (
            runtime.classifier.store is classifier_before.store
            and runtime.classifier is not classifier_before
        )
        for app in (api, replica):  # the replica follows on its next request, the checkpoint kept
            served = classify(app, QUESTION)
            assert served["model_version"] == version
            assert set(served["predictions"][0]["probabilities"]) == {"0", "1", "2"}

        example = {"examples": [{"text": QUESTION, "label": "2", "id": 100}]}
        assert api.post("/v1/tasks/reviews/examples", json=example).status_code == 201
        for app in (api, replica):
            prediction = classify(app, QUESTION)["predictions"][0]
            assert {"id": 100, "label": "2"} in [
                {k: n[k] for k in ("id", "label")} for n in prediction["neighbours"]
            ]
            assert prediction["p_knn"]["2"] > 0

        assert api.post("/v1/tasks/reviews/labels", json={"label": "2", "word": "who"}).status_code == 409
        in_use = api.delete("/v1/tasks/reviews/labels/2")
        assert in_use.status_code == 409 and "delete them first" in in_use.json()["detail"]
        trained = api.delete("/v1/tasks/reviews/labels/1")
        assert (
            trained.status_code == 409
            and f"checkpoint {version} was trained with" in trained.json()["detail"]
        )

        # A label added after the served checkpoint, with no examples, can go; the checkpoint serves on.
        assert api.post("/v1/tasks/reviews/labels", json={"label": "3", "word": "who"}).status_code == 201
        assert set(classify(replica, QUESTION)["predictions"][0]["probabilities"]) == {"0", "1", "2", "3"}
        removed = api.delete("/v1/tasks/reviews/labels/3")
        assert removed.status_code == 200 and list(removed.json()["labels"]) == ["0", "1", "2"]
        for app in (api, replica):
            served = classify(app, QUESTION)
            assert served["model_version"] == version
            assert set(served["predictions"][0]["probabilities"]) == {"0", "1", "2"}
            assert served["predictions"][0]["neighbours"][0]["id"] == 100  # the store came along

        # The next training trains the new label: its checkpoint has it, and it is swapped in everywhere.
        more = {"examples": [{"text": "who wrote the book about the river", "label": "2", "id": 101}]}
        assert api.post("/v1/tasks/reviews/examples", json=more).status_code == 201
        retrained = train(api, server, tmp_path / "artifacts")
        manifest = json.loads((tmp_path / "artifacts" / "reviews" / retrained / "manifest.json").read_text())
        assert manifest["labels"] == ["0", "1", "2"] and manifest["label_words"] == ["bad", "good", "what"]
        for app in (api, replica):
            wait_for(lambda app=app: classify(app, QUESTION)["model_version"] == retrained)


def test_a_word_the_backbone_cannot_score_is_422_and_nothing_is_written(server, masked_dir: Path) -> None:
    with TestClient(create_app(api_settings(server.url, masked_dir))) as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        before = redis.Redis.from_url(server.url).hget(TASKS_KEY, "reviews")
        for word, says in (("\u200b", "tokenizes to nothing"), ("good", "same word")):
            response = api.post("/v1/tasks/reviews/labels", json={"label": "2", "word": word})
            assert response.status_code == 422, response.text
            (error,) = response.json()["detail"]
            assert error["loc"] == ["body", "word"] and says in error["msg"]
        assert redis.Redis.from_url(server.url).hget(TASKS_KEY, "reviews") == before
        assert api.post("/v1/tasks/reviews/labels", json={"label": " ", "word": "x"}).status_code == 422
        assert api.post("/v1/tasks/nope/labels", json={"label": "2", "word": "what"}).status_code == 404
        assert api.delete("/v1/tasks/reviews/labels/7").status_code == 404
        last_two = api.delete("/v1/tasks/reviews/labels/0")
        assert last_two.status_code == 409 and "fewer than 2" in last_two.json()["detail"]
        assert redis.Redis.from_url(server.url).hget(TASKS_KEY, "reviews") == before


def test_a_label_whose_examples_were_deleted_can_go_from_an_untrained_task(make_client) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert api.post("/v1/tasks/reviews/labels", json={"label": "2", "word": "what"}).status_code == 201
        example = {
            "examples": [{"text": QUESTION, "label": "2", "id": 5}, {"text": "fun", "label": "1", "id": 6}]
        }
        assert api.post("/v1/tasks/reviews/examples", json=example).status_code == 201
        assert api.delete("/v1/tasks/reviews/labels/2").status_code == 409
        assert api.delete("/v1/tasks/reviews/examples/5").status_code == 204
        assert api.delete("/v1/tasks/reviews/labels/2").status_code == 200
        # The task is served from its log again, the removed label's example (added, then deleted) skipped.
        served = classify(api, QUESTION)
        assert set(served["predictions"][0]["probabilities"]) == {"0", "1"}
        assert [n["id"] for n in served["predictions"][0]["neighbours"]] == [6]
        refused = api.post("/v1/tasks/reviews/examples", json={"examples": [{"text": "x", "label": "2"}]})
        assert refused.status_code == 422


def test_the_log_refuses_a_label_the_stored_spec_lacks(server) -> None:
    client = redis.Redis.from_url(server.url)
    client.hset(TASKS_KEY, "reviews", Task(**TASK, backbone="tiny").model_dump_json())
    log = ExampleLog(client, "reviews")
    with pytest.raises(UnknownLabel, match="'2'") as refused:
        log.append([NewExample("fine", "1"), NewExample("a question", "2")])
    assert refused.value.position == 1 and log.read() == [] and len(log) == 0
    assert [a.id for a in log.append([NewExample("fine", "1", id=3)])] == [3]


def test_a_spec_swap_decided_on_a_stale_read_writes_nothing(server) -> None:
    client = redis.Redis.from_url(server.url)
    task = Task(**TASK, backbone="tiny")
    client.hset(TASKS_KEY, "reviews", task.model_dump_json())
    read = client.hget(TASKS_KEY, "reviews")
    meanwhile = task.model_copy(update={"labels": {**task.labels, "3": "who"}})
    client.hset(TASKS_KEY, "reviews", meanwhile.model_dump_json())  # another change lands first
    grown = task.model_copy(update={"labels": {**task.labels, "2": "what"}})
    assert not swap_spec(client, read, grown)
    assert Task.model_validate_json(client.hget(TASKS_KEY, "reviews")) == meanwhile

    # With the log named, the swap also needs the log to end where the caller last read it.
    log = ExampleLog(client, "reviews")
    current = client.hget(TASKS_KEY, "reviews")
    (added,) = log.append([NewExample("fine", "1")])
    assert not swap_spec(client, current, task, log_key=log.stream_key, log_offset="0-0")
    assert Task.model_validate_json(client.hget(TASKS_KEY, "reviews")) == meanwhile
    assert swap_spec(client, current, task, log_key=log.stream_key, log_offset=added.offset)
    assert Task.model_validate_json(client.hget(TASKS_KEY, "reviews")) == task
