"""An upload of examples that creates the labels it names (`create_labels`): the labels and the examples
are stored together or not at all, and every replica serves them."""

from __future__ import annotations

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.bus.examples_log import ExampleLog, NewExample, SpecChanged, SpecSwap
from services.bus.keys import TASKS_KEY
from services.engine.task_spec import Task
from tests.services.harness import TASK, api_settings

ROWS = [
    ("fly me to rome on friday", "book_flight"),
    ("a good film", "1"),
    ("send 20 dollars to anna", "transferMoney"),
    ("a flight to paris please", "book_flight"),
]


def upload(api: TestClient, rows, create_labels: bool | None = True, first_id: int = 0):
    body: dict = {
        "examples": [{"text": t, "label": label, "id": first_id + i} for i, (t, label) in enumerate(rows)]
    }
    if create_labels is not None:
        body["create_labels"] = create_labels
    return api.post("/v1/tasks/reviews/examples", json=body)


def stored(server) -> tuple[bytes | None, int]:
    """The stored spec and the log's length: what a refused upload must leave as it found them."""
    client = redis.Redis.from_url(server.url)
    return client.hget(TASKS_KEY, "reviews"), len(ExampleLog(client, "reviews"))


def test_an_upload_creates_the_labels_it_names_and_every_replica_serves_them(server, causal_dir) -> None:
    settings = api_settings(server.url, causal_dir)
    with TestClient(create_app(settings)) as api, TestClient(create_app(settings)) as replica:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert replica.get("/v1/tasks/reviews").status_code == 200  # the replica holds the task before
        response = upload(api, ROWS)
        assert response.status_code == 201, response.text
        assert [a["created"] for a in response.json()["examples"]] == [True] * 4
        labels = api.get("/v1/tasks/reviews").json()["labels"]
        assert labels == {**TASK["labels"], "book_flight": "book flight", "transferMoney": "transfer money"}
        for app in (api, replica):
            body = {"texts": ["fly me to rome on friday"], "neighbours": True}
            prediction = app.post("/v1/tasks/reviews/classify", json=body).json()["predictions"][0]
            assert list(prediction["probabilities"]) == list(labels)
            assert prediction["neighbours"][0] == {
                **prediction["neighbours"][0],
                "id": 0,
                "label": "book_flight",
            }

        again = upload(api, ROWS)  # a retry: the labels are there now, and so are the examples
        assert again.status_code == 201 and not any(a["created"] for a in again.json()["examples"])
        assert api.get("/v1/tasks/reviews").json()["labels"] == labels


@pytest.mark.parametrize("flag", [None, False])
def test_without_the_flag_an_unknown_label_is_a_422_at_its_row(make_client, server, flag) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        before = stored(server)
        response = upload(api, ROWS[1:], create_labels=flag)
        assert response.status_code == 422
        (error,) = response.json()["detail"]
        assert (
            error["loc"] == ["body", "examples", 1, "label"]
            and "unknown label 'transferMoney'" in error["msg"]
        )
        assert stored(server) == before


def test_a_refused_upload_creates_no_label_and_writes_no_example(make_client, server) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert upload(api, [("a bad film", "0")], first_id=3).status_code == 201
        before = stored(server)
        # id 3 is in the log with another text: a conflict, found after the labels were decided
        conflict = upload(api, ROWS)
        assert conflict.status_code == 409 and "example id 3" in conflict.json()["detail"]
        assert stored(server) == before

        for rows, row, says in (
            ([*ROWS[:2], ("who made you", "__")], 2, "no word in it"),
            ([*ROWS[:2], ("who made you", "")], 2, "no word in it"),
            ([*ROWS[:2], ("so good", "Good")], 2, "would have the word 'good', which label '1' has"),
            ([("fly", "book_flight"), ("fly", "book-flight")], 1, "which label 'book_flight' has"),
        ):
            response = upload(api, rows, first_id=10)
            assert response.status_code == 422, (rows, response.text)
            (error,) = response.json()["detail"]
            assert error["loc"] == ["body", "examples", row, "label"] and says in error["msg"], error
            assert stored(server) == before
        acronym = upload(api, [("SO GOOD", "GOOD")], first_id=10)  # an acronym keeps its case: not "good"
        assert acronym.status_code == 201 and api.get("/v1/tasks/reviews").json()["labels"]["GOOD"] == "GOOD"


def test_an_upload_may_not_take_the_task_over_the_most_labels(make_client, server, monkeypatch) -> None:
    monkeypatch.setattr("services.engine.labels.MAX_LABELS", 4)  # the rule, without scoring 1,000 words
    with make_client() as api:
        assert api.post("/v1/tasks", json={**TASK, "labels": ["bad", "good", "fun"]}).status_code == 201
        before = stored(server)
        response = upload(api, [("one", "new_one"), ("two", "new_two")])
        assert response.status_code == 422
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "create_labels"] and "the most a task may have, 4" in error["msg"]
        assert stored(server) == before
        assert upload(api, [("one", "new_one")]).status_code == 201  # up to the most


def test_the_log_stores_a_batchs_spec_swap_with_it_or_not_at_all(server) -> None:
    client = redis.Redis.from_url(server.url)
    task = Task(**TASK, backbone="tiny")
    client.hset(TASKS_KEY, "reviews", task.model_dump_json())
    read = client.hget(TASKS_KEY, "reviews")
    assert read is not None
    grown = task.model_copy(update={"labels": {**task.labels, "2": "what"}}).model_dump_json()
    log = ExampleLog(client, "reviews")
    client.hset(TASKS_KEY, "reviews", task.model_copy(update={"min_confidence": 0.5}).model_dump_json())
    with pytest.raises(SpecChanged):  # another change landed since `read`: nothing written
        log.append([NewExample("a question", "2")], spec_swap=SpecSwap(read, grown))
    assert len(log) == 0 and b'"2"' not in client.hget(TASKS_KEY, "reviews")

    client.hset(TASKS_KEY, "reviews", read)
    (appended,) = log.append([NewExample("a question", "2")], spec_swap=SpecSwap(read, grown))
    assert appended.offset is not None and client.hget(TASKS_KEY, "reviews") == grown.encode()


def test_the_client_uploads_with_create_labels(make_client) -> None:
    from services.api.schemas import ExampleIn
    from services.client import OpenBookClient, OpenBookError

    with make_client() as api, OpenBookClient(http=api) as client:
        client.create_task("reviews", TASK["template"], TASK["labels"])
        rows = [ExampleIn(text=t, label=label, id=i) for i, (t, label) in enumerate(ROWS)]
        with pytest.raises(OpenBookError) as refused:
            client.add_examples("reviews", rows)
        assert refused.value.status == 422
        ack = client.add_examples("reviews", rows, create_labels=True)
        assert [a.id for a in ack.examples] == [0, 1, 2, 3]
        assert list(client.http.get("/v1/tasks/reviews").json()["labels"])[2:] == [
            "book_flight",
            "transferMoney",
        ]
