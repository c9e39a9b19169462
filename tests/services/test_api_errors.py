"""Bad input gets a 4xx in the declared shape, never a 500; a task whose stored spec broke stays alone."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from services.bus.keys import TASKS_KEY
from tests.services.harness import PAIR_TASK, TASK


@pytest.fixture()
def api(make_client):
    with make_client() as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        assert client.post("/v1/tasks", json=PAIR_TASK).status_code == 201
        yield client


def post_raw(client: TestClient, path: str, body: str):
    """POST a JSON text as written: Python's json module reads NaN, Infinity and lone surrogates in it."""
    return client.post(path, content=body.encode(), headers={"content-type": "application/json"})


def validation_messages(response) -> str:
    """The 422 in FastAPI's validation-error shape (a list of {loc, msg, type}); its messages, joined."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    for error in detail:
        assert (
            isinstance(error["loc"], list)
            and isinstance(error["msg"], str)
            and isinstance(error["type"], str)
        )
    return " | ".join(error["msg"] for error in detail)


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/tasks/reviews/classify", '{"texts": NaN}', "list"),
        ("/v1/tasks/reviews/classify", '{"texts": [Infinity]}', "string"),
        ("/v1/tasks/reviews/examples", '{"examples": [{"text": "a", "label": "1", "id": NaN}]}', "finite"),
        ("/v1/tasks/reviews/train", '{"lr": NaN}', "finite"),
        ("/v1/tasks", json.dumps({**TASK, "name": "nan", "knn": {"temperature": float("nan")}}), "finite"),
        ("/v1/tasks", json.dumps({**TASK, "name": "inf", "knn": {"temperature": float("inf")}}), "finite"),
        ("/v1/tasks/reviews/classify", '{"texts": ["\\ud800"]}', "unicode"),
        ("/v1/tasks/reviews/examples", '{"examples": [{"text": "fine \\udfff", "label": "1"}]}', "unicode"),
        (
            "/v1/tasks",
            json.dumps({**TASK, "name": "sur", "labels": {"\ud800": "bad", "1": "good"}}),
            "unicode",
        ),
        (
            "/v1/tasks/reviews/examples",
            '{"examples": [{"text": "a", "label": "1", "id": 5}, {"text": "b", "label": "0", "id": 5}]}',
            "twice",
        ),
        ("/v1/tasks/reviews/classify", '{"texts": ["   "]}', "pattern"),
        ("/v1/tasks/reviews/classify", '{"texts": ["\\u001c\\u3000"]}', "pattern"),
        ("/v1/tasks/reviews/examples", '{"examples": [{"text": " \\n", "label": "1"}]}', "pattern"),
        ("/v1/tasks/pairs/classify", '{"texts": [["it rains", "\\t"]]}', "pattern"),
        ("/v1/tasks/reviews/demonstrations", '{"text": ["a pair", "sent to a single-text task"]}', "single"),
        ("/v1/tasks/pairs/demonstrations", '{"text": "a single text sent to a pair task"}', "pairs"),
        ("/v1/tasks/reviews/demonstrations", '{"text": "  "}', "pattern"),
    ],
)
def test_bad_input_is_a_4xx_in_the_validation_shape(api: TestClient, path: str, body: str, says: str) -> None:
    assert says in validation_messages(post_raw(api, path, body))
    # nothing was written: no example, no task
    assert api.get("/v1/tasks/reviews/examples").json()["examples"] == []
    assert sorted(task["name"] for task in api.get("/v1/tasks").json()) == ["pairs", "reviews"]


def test_a_backbone_is_only_one_the_service_knows(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import services.engine.backbones

    loads: list[str] = []

    def never_load(config):
        loads.append(config.name)
        raise OSError(f"{config.name} is not a model")  # what a hub miss or a stray path ends in

    monkeypatch.setattr(services.engine.backbones, "load_backbone", never_load)
    for backbone in ("no-such-model-anywhere", "/etc", "/etc/../etc", "../../models/tiny", "gpt2"):
        started = time.perf_counter()
        response = api.post("/v1/tasks", json={**TASK, "name": "other", "backbone": backbone})
        assert "unknown backbone" in validation_messages(response)
        assert time.perf_counter() - started < 2  # no hub was tried
    assert loads == []
    assert [t["name"] for t in api.get("/v1/tasks").json()] == ["pairs", "reviews"]


def test_an_infinite_number_is_refused_and_never_stored(api: TestClient) -> None:
    body = '{"name": "hot", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}, '
    response = post_raw(api, "/v1/tasks", body + '"knn": {"temperature": 1e999}}')
    assert "finite" in validation_messages(response)
    listed = api.get("/v1/tasks")
    assert listed.status_code == 200 and [t["name"] for t in listed.json()] == ["pairs", "reviews"]
    assert api.post("/v1/tasks/reviews/classify", json={"texts": ["fine"]}).status_code == 200


def test_a_stored_spec_that_no_longer_validates_breaks_only_its_task(make_client, server) -> None:
    import redis

    # What an earlier version stored for `knn.temperature: 1e999`: JSON has no Infinity, so null.
    broken = {**TASK, "name": "broken", "backbone": "x", "method": "retroprompt"}
    broken["knn"] = {"k": 16, "temperature": None, "lam": 0.5}
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        redis.Redis.from_url(server.url).hset(TASKS_KEY, "broken", json.dumps(broken))

        listed = api.get("/v1/tasks")
        assert listed.status_code == 200 and [t["name"] for t in listed.json()] == ["reviews"]
        assert listed.headers["openbook-broken-tasks"] == "broken"
        for method, path, body in [
            ("GET", "/v1/tasks/broken", None),
            ("POST", "/v1/tasks/broken/classify", {"texts": ["fine"]}),
            ("GET", "/v1/tasks/broken/examples", None),
            ("POST", "/v1/tasks/broken/examples", {"examples": [{"text": "fine", "label": "1"}]}),
        ]:
            response = api.request(method, path, json=body)
            assert response.status_code == 409, (path, response.text)
            assert "no longer valid" in response.json()["detail"]
        same_name = api.post("/v1/tasks", json={**TASK, "name": "broken"})
        assert same_name.status_code == 409 and "no longer valid" in same_name.json()["detail"]
        assert api.post("/v1/tasks/reviews/classify", json={"texts": ["fine"]}).status_code == 200

    with make_client() as restarted:  # a restart loads the others and becomes ready
        ready = wait_ready(restarted)
        assert ready.status_code == 200 and ready.json()["tasks"] == 1
        assert "temperature" in ready.json()["broken"]["broken"]  # named, with the reason
        assert restarted.delete("/v1/tasks/broken").status_code == 204
        assert "broken" not in wait_ready(restarted).json()["broken"]


def wait_ready(client: TestClient, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while (response := client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    return response


def test_a_log_entry_the_store_cannot_take_breaks_only_its_task(make_client, server) -> None:
    import redis

    from services.bus.examples_log import ExampleLog, NewExample

    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert api.post("/v1/tasks", json=PAIR_TASK).status_code == 201
        # A pair in a single-text task, which the api never accepts: the log holds it, no store can take it.
        ExampleLog(redis.Redis.from_url(server.url), "reviews").append([NewExample(("a", "b"), "1")])
    with make_client() as restarted:
        ready = wait_ready(restarted)
        assert ready.status_code == 200 and "replayed" in ready.json()["broken"]["reviews"]
        assert restarted.post("/v1/tasks/pairs/classify", json={"texts": [["a", "b"]]}).status_code == 200
