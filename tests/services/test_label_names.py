"""Tasks created from label names, and labels added to a live task by name: the words the api makes, the
sets it refuses (nothing written), the most labels a task may have, and the typed client."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.bus.keys import TASKS_KEY
from services.client import OpenBookClient, OpenBookError
from services.engine.task_spec import MAX_LABELS
from tests.services.harness import api_settings

TEMPLATE = "{text} It was {mask}"
INTENTS = ["book_flight", "transferMoney", "what-is-your-name"]


def create(api: TestClient, labels: object, name: str = "intents"):
    return api.post("/v1/tasks", json={"name": name, "template": TEMPLATE, "labels": labels})


def test_a_task_created_from_label_names_is_scored_by_their_readable_words(make_client) -> None:
    with make_client() as api:
        created = create(api, INTENTS)
        assert created.status_code == 201, created.text
        words = {
            "book_flight": "book flight",
            "transferMoney": "transfer money",
            "what-is-your-name": "what is your name",
        }
        assert created.json()["labels"] == words
        assert api.get("/v1/tasks/intents").json()["labels"] == words  # stored as label -> word
        prediction = api.post("/v1/tasks/intents/classify", json={"texts": ["fly me to rome"]}).json()
        assert list(prediction["predictions"][0]["probabilities"]) == INTENTS
        assert create(api, {"0": "bad", "1": "good"}, "reviews").status_code == 201  # the object form stays


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        (["book_flight", "transfer", "book_flight"], "'book_flight' appears twice"),
        (["book_flight", " "], "a label name is empty"),
        (["book_flight", "__"], "has no word in it"),
        (["book_flight", "transfer", "BookFlight"], "both make the word 'book flight'"),
        (["book_flight"], "1 label name(s): give 2 to"),
        (["book_flight", 7], "label names must be strings"),
        ([f"intent_{i}" for i in range(MAX_LABELS + 1)], f"give 2 to {MAX_LABELS}"),
        ({str(i): f"w{i}" for i in range(MAX_LABELS + 1)}, f"at most {MAX_LABELS} items"),
    ],
)
def test_a_label_set_that_cannot_be_served_is_a_422_and_nothing_is_written(
    make_client, server, labels: object, says: str
) -> None:
    with make_client() as api:
        response = create(api, labels)
        assert response.status_code == 422, response.text
        assert any(
            e["loc"][:2] == ["body", "labels"] and says in e["msg"] for e in response.json()["detail"]
        ), response.json()
        assert not redis.Redis.from_url(server.url).hexists(TASKS_KEY, "intents")


def test_labels_are_added_to_a_live_task_by_name_all_or_none(make_client, server) -> None:
    stored = redis.Redis.from_url(server.url)
    with make_client() as api:
        assert create(api, INTENTS).status_code == 201
        one = api.post("/v1/tasks/intents/labels", json={"label": "cancel_reservation"})
        assert one.status_code == 201, one.text
        assert one.json()["labels"]["cancel_reservation"] == "cancel reservation"
        several = api.post("/v1/tasks/intents/labels", json={"labels": ["pin_change", "reportLostCard"]})
        assert several.status_code == 201, several.text
        assert list(several.json()["labels"].items())[-2:] == [
            ("pin_change", "pin change"),
            ("reportLostCard", "report lost card"),
        ]
        given = api.post("/v1/tasks/intents/labels", json={"labels": {"tip": "gratuity"}})
        assert given.status_code == 201 and given.json()["labels"]["tip"] == "gratuity"

        before = stored.hget(TASKS_KEY, "intents")
        for body, status, where, says in (
            ({"labels": ["new_one", "pin_change"]}, 409, None, "has label 'pin_change' already"),
            (
                {"labels": ["new_one", "pin-change"]},
                422,
                ["body", "labels"],
                "same word as label 'pin_change'",
            ),
            ({"labels": ["new_one", "NewOne"]}, 422, ["body", "labels"], "both make the word"),
            ({"label": "__"}, 422, ["body", "label"], "has no word in it"),
            ({"label": "new_one", "labels": ["other"]}, 422, ["body"], "not both"),
            ({"word": "new"}, 422, ["body"], "give `label`"),
            ({"labels": ["x"] * 2}, 422, ["body", "labels"], "appears twice"),
        ):
            response = api.post("/v1/tasks/intents/labels", json=body)
            assert response.status_code == status, (body, response.text)
            detail = response.json()["detail"]
            if where is None:
                assert says in detail
            else:
                assert any(e["loc"] == where and says in e["msg"] for e in detail), (body, detail)
        assert stored.hget(TASKS_KEY, "intents") == before


def test_the_most_labels_a_task_may_have(server, masked_dir: Path) -> None:
    # the masked backbone scores a word of several tokens in the slot's one forward (a causal one scores
    # each word's tail in a forward of its own: a thousand of them)
    names = [f"intent_{i}" for i in range(MAX_LABELS - 1)]
    with TestClient(create_app(api_settings(server.url, masked_dir))) as api:
        assert create(api, names).status_code == 201
        assert api.post("/v1/tasks/intents/labels", json={"label": "last_one"}).status_code == 201
        over = api.post("/v1/tasks/intents/labels", json={"labels": ["one_more"]})
        assert over.status_code == 422 and f"the most a task may have, {MAX_LABELS}" in over.text
        assert len(api.get("/v1/tasks/intents").json()["labels"]) == MAX_LABELS


def test_the_openapi_shows_both_forms_of_labels(make_client) -> None:
    with make_client() as api:
        schemas = api.get("/openapi.json").json()["components"]["schemas"]
    forms = schemas["TaskCreate"]["properties"]["labels"]["anyOf"]
    assert [form["type"] for form in forms] == ["object", "array"]
    assert forms[1]["maxItems"] == forms[0]["maxProperties"] == MAX_LABELS
    assert schemas["Task"]["properties"]["labels"]["type"] == "object"  # what is stored and returned


def test_the_client_takes_label_names(make_client) -> None:
    with make_client() as api, OpenBookClient(http=api) as client:
        task = client.create_task("intents", TEMPLATE, INTENTS)
        assert task.labels["what-is-your-name"] == "what is your name"
        assert client.add_label("intents", "pin_change").labels["pin_change"] == "pin change"
        assert client.add_label("intents", "tip", "gratuity").labels["tip"] == "gratuity"
        grown = client.add_labels("intents", ("roll_dice", "flipCoin"))
        assert (
            list(grown.labels)[-2:] == ["roll_dice", "flipCoin"] and grown.labels["flipCoin"] == "flip coin"
        )
        with pytest.raises(OpenBookError) as refused:
            client.add_labels("intents", ["flip_coin"])
        assert refused.value.status == 422 and "same word" in str(refused.value.detail)
