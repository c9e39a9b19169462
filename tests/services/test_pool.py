"""The pool of unlabelled texts and its suggestions, over a real embedded Redis and the tiny backbone."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from openbook.predictions import Prediction

from services.api.serving.unlabelled import disagreement, margin, rank_by_uncertainty
from tests.services.harness import PAIR_TASK, TASK

POOL = "/v1/tasks/reviews/pool"
SUGGESTIONS = "/v1/tasks/reviews/suggestions"
EXAMPLES = [
    {"text": t, "label": label, "id": 900 + i}
    for i, (t, label) in enumerate(
        [("a good film", "1"), ("great fun", "1"), ("boring", "0"), ("a bad film , it was awful", "0")]
    )
]
CANDIDATES = ["fine", "a good film", "dull", "great fun , boring", "not bad at all", "awful film", "ok"]


@pytest.fixture()
def api(make_client):
    with make_client(max_batch=4, max_text_chars=100, batch_max_texts=3) as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        yield client


def _fill(api: TestClient, texts: list[str], first_id: int = 1) -> None:
    for start in range(0, len(texts), 4):  # max_batch is 4
        batch = [{"id": first_id + start + i, "text": t} for i, t in enumerate(texts[start : start + 4])]
        assert api.post(POOL, json={"texts": batch}).status_code == 201


def _prediction(probabilities: dict, p_lm: dict, p_knn: dict | None) -> Prediction:
    label = max(probabilities, key=probabilities.__getitem__)
    return Prediction(label, probabilities, p_lm, p_knn, (), False)


def test_ranking_breaks_margin_ties_by_disagreement() -> None:
    sure = _prediction({"0": 0.9, "1": 0.1}, {"0": 0.9, "1": 0.1}, None)
    tie_agreeing = _prediction({"0": 0.55, "1": 0.45}, {"0": 0.55, "1": 0.45}, {"0": 0.55, "1": 0.45})
    tie_disagreeing = _prediction({"0": 0.45, "1": 0.55}, {"0": 0.1, "1": 0.9}, {"0": 0.8, "1": 0.2})
    unsure = _prediction({"0": 0.5, "1": 0.5}, {"0": 0.5, "1": 0.5}, None)
    assert margin(tie_agreeing.probabilities) == pytest.approx(0.1)
    assert disagreement(tie_disagreeing) == pytest.approx(0.7) and disagreement(sure) == 0.0
    assert rank_by_uncertainty([sure, tie_agreeing, tie_disagreeing, unsure]) == [3, 2, 1, 0]


def test_suggestions_are_the_pool_texts_the_model_is_least_sure_of(api: TestClient) -> None:
    assert api.post("/v1/tasks/reviews/examples", json={"examples": EXAMPLES}).status_code == 201
    _fill(api, CANDIDATES)
    classified = api.post("/v1/tasks/reviews/classify", json={"texts": CANDIDATES[:4]}).json()
    classified["predictions"] += api.post(
        "/v1/tasks/reviews/classify", json={"texts": CANDIDATES[4:]}
    ).json()["predictions"]
    margins = {}
    for i, p in enumerate(classified["predictions"]):
        top, second = sorted(p["probabilities"].values(), reverse=True)[:2]
        tv = 0.5 * sum(abs(p["p_lm"][label] - p["p_knn"][label]) for label in p["p_lm"])
        margins[i + 1] = (top - second, -tv)
    expected = sorted(margins, key=margins.__getitem__)

    response = api.get(SUGGESTIONS, params={"n": 5})  # 7 texts scored in batches of 3
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["scored"] == 7 and body["model_version"] == "base"
    assert body["store_version"] == classified["store_version"]
    suggestions = body["suggestions"]
    assert [s["id"] for s in suggestions] == expected[:5]
    assert suggestions[0]["margin"] == pytest.approx(min(m for m, _ in margins.values()), abs=1e-5)
    assert [s["margin"] for s in suggestions] == sorted(s["margin"] for s in suggestions)
    first = suggestions[0]
    assert first["text"] == CANDIDATES[first["id"] - 1]
    same = classified["predictions"][first["id"] - 1]
    assert first["prediction"]["label"] == same["label"]
    assert first["prediction"]["probabilities"] == pytest.approx(same["probabilities"], abs=1e-5)
    assert first["prediction"]["p_knn"] == pytest.approx(same["p_knn"], abs=1e-5)


def test_a_deliberately_ambiguous_text_is_suggested_first(make_client) -> None:
    # The store decides alone (lambda 1), from the two nearest neighbours at a sharp temperature. "so-so"
    # is labelled once as each label, so its two nearest neighbours (itself, twice) split 50/50: margin 0.
    # Every other pool text repeats an example of one label: its nearest neighbour is that example.
    task = {**TASK, "name": "ambiguous", "knn": {"k": 2, "temperature": 0.01, "lam": 1.0}}
    labelled = [("so-so", "0"), ("so-so", "1"), ("a good film", "1"), ("great fun", "1"), ("boring", "0")]
    labelled += [("a bad film , it was awful", "0")]
    with make_client(max_batch=8) as api:
        assert api.post("/v1/tasks", json=task).status_code == 201
        examples = [{"text": t, "label": label, "id": 700 + i} for i, (t, label) in enumerate(labelled)]
        assert api.post("/v1/tasks/ambiguous/examples", json={"examples": examples}).status_code == 201
        pool = ["a good film", "boring", "great fun", "so-so", "a bad film , it was awful"]
        body = {"texts": [{"id": i + 1, "text": t} for i, t in enumerate(pool)]}
        assert api.post("/v1/tasks/ambiguous/pool", json=body).status_code == 201
        suggestions = api.get("/v1/tasks/ambiguous/suggestions", params={"n": 5}).json()["suggestions"]
        assert suggestions[0]["text"] == "so-so"
        assert suggestions[0]["margin"] == pytest.approx(0.0, abs=1e-4)
        assert all(s["margin"] > 0.5 for s in suggestions[1:])  # the others lean clearly one way


def test_pool_adds_are_idempotent_and_a_changed_text_conflicts(api: TestClient) -> None:
    first = api.post(POOL, json={"texts": [{"id": 3, "text": "fine"}, {"id": 9, "text": "dull"}]})
    assert first.status_code == 201, first.text
    assert first.json() == {"texts": [{"id": 3, "created": True}, {"id": 9, "created": True}]}
    retry = api.post(POOL, json={"texts": [{"id": 9, "text": "dull"}, {"id": 5, "text": "ok"}]})
    assert retry.json() == {"texts": [{"id": 9, "created": False}, {"id": 5, "created": True}]}
    changed = api.post(POOL, json={"texts": [{"id": 7, "text": "new"}, {"id": 3, "text": "other"}]})
    assert changed.status_code == 409 and "pool id 3" in changed.json()["detail"]

    page = api.get(POOL, params={"limit": 2}).json()  # id 7 was not written: the batch is checked whole
    assert page == {"texts": [{"id": 3, "text": "fine"}, {"id": 5, "text": "ok"}], "next_after": 5}
    assert api.get(POOL, params={"after": 5}).json() == {
        "texts": [{"id": 9, "text": "dull"}],
        "next_after": None,
    }


@pytest.mark.parametrize(
    ("method", "path", "body", "code", "says"),
    [
        ("post", POOL, {"texts": [{"id": 1, "text": " \n"}]}, 422, "pattern"),
        ("post", POOL, {"texts": [{"id": 1, "text": ""}]}, 422, "at least 1"),
        ("post", POOL, {"texts": [{"id": -1, "text": "x"}]}, 422, "greater"),
        ("post", POOL, {"texts": [{"id": 2**53, "text": "x"}]}, 422, "less"),
        ("post", POOL, {"texts": [{"text": "x"}]}, 422, "Field required"),
        ("post", POOL, {"texts": [{"id": 1, "text": "a"}, {"id": 1, "text": "b"}]}, 422, "twice"),
        ("post", POOL, {"texts": [{"id": i, "text": "x"} for i in range(5)]}, 422, "over the limit of 4"),
        ("post", POOL, {"texts": [{"id": 1, "text": "x" * 101}]}, 422, "100 characters"),
        ("post", POOL, {"texts": [{"id": 1, "text": ["a", "b"]}]}, 422, "single texts"),
        ("post", POOL, {"texts": []}, 422, "at least 1"),
        ("get", f"{SUGGESTIONS}?n=0", None, 422, "greater"),
        ("get", f"{SUGGESTIONS}?n=101", None, 422, "less"),
        ("get", f"{POOL}?limit=0", None, 422, "greater"),
        ("get", "/v1/tasks/nope/suggestions", None, 404, "no task 'nope'"),
        ("get", "/v1/tasks/nope/pool", None, 404, "no task 'nope'"),
        ("post", "/v1/tasks/nope/pool", {"texts": [{"id": 1, "text": "x"}]}, 404, "no task 'nope'"),
    ],
)
def test_bad_pool_requests(api: TestClient, method: str, path: str, body, code: int, says: str) -> None:
    response = api.request(method, path, json=body)
    assert response.status_code == code, response.text
    assert says in str(response.json()["detail"])
    assert api.get(POOL).json()["texts"] == []  # nothing was written


def test_a_pair_task_pools_pairs(api: TestClient) -> None:
    assert api.post("/v1/tasks", json=PAIR_TASK).status_code == 201
    path = "/v1/tasks/pairs/pool"
    single = api.post(path, json={"texts": [{"id": 1, "text": "it rains"}]})
    assert single.status_code == 422 and single.json()["detail"][0]["loc"] == ["body", "texts", 0, "text"]
    assert api.post(path, json={"texts": [{"id": 1, "text": ["it rains", "it is wet"]}]}).status_code == 201
    (suggestion,) = api.get("/v1/tasks/pairs/suggestions").json()["suggestions"]
    assert suggestion["text"] == ["it rains", "it is wet"] and suggestion["prediction"]["p_knn"] is None


def test_labelling_a_pool_text_takes_it_out_of_the_pool(api: TestClient) -> None:
    _fill(api, ["fine", "dull", "ok"])
    example = {"text": "dull", "label": "0", "id": 2}
    assert api.post("/v1/tasks/reviews/examples", json={"examples": [example]}).status_code == 201
    assert [t["id"] for t in api.get(POOL).json()["texts"]] == [1, 3]
    assert {s["id"] for s in api.get(SUGGESTIONS).json()["suggestions"]} == {1, 3}
    # An example whose id the log assigns leaves the pool alone, whatever id it gets.
    assert (
        api.post("/v1/tasks/reviews/examples", json={"examples": [{"text": "x", "label": "1"}]}).json()[
            "examples"
        ][0]["id"]
        == 1
    )
    assert [t["id"] for t in api.get(POOL).json()["texts"]] == [1, 3]


def test_deleting_the_task_deletes_its_pool(api: TestClient) -> None:
    _fill(api, ["fine", "dull"])
    assert api.delete("/v1/tasks/reviews").status_code == 204
    assert api.get(POOL).status_code == 404
    assert api.post("/v1/tasks", json=TASK).status_code == 201
    assert api.get(POOL).json() == {"texts": [], "next_after": None}
    empty = api.get(SUGGESTIONS).json()
    assert empty["suggestions"] == [] and empty["scored"] == 0
    # The id is free again: the old text no longer conflicts.
    assert api.post(POOL, json={"texts": [{"id": 1, "text": "other"}]}).json()["texts"][0]["created"]


def test_the_write_key_guards_adding_to_the_pool(make_client) -> None:
    with make_client(api_key="s3cret", read_key="r3ad") as client:
        write, read = {"X-API-Key": "s3cret"}, {"X-API-Key": "r3ad"}
        assert client.post("/v1/tasks", json=TASK, headers=write).status_code == 201
        body = {"texts": [{"id": 1, "text": "fine"}]}
        assert client.post(POOL, json=body).status_code == 401
        assert client.post(POOL, json=body, headers=read).status_code == 403
        assert client.post(POOL, json=body, headers=write).status_code == 201
        assert client.get(POOL).status_code == 401 and client.get(SUGGESTIONS).status_code == 401
        assert client.get(POOL, headers=read).json()["texts"] == [{"id": 1, "text": "fine"}]
        assert [s["id"] for s in client.get(SUGGESTIONS, headers=read).json()["suggestions"]] == [1]


def test_the_openapi_declares_the_pool_routes(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    statuses = {
        ("post", "/v1/tasks/{task}/pool"): {201, 400, 401, 403, 404, 409, 413, 422, 503},
        ("get", "/v1/tasks/{task}/pool"): {200, 401, 403, 404, 409, 422, 503},
        ("get", "/v1/tasks/{task}/suggestions"): {200, 401, 403, 404, 409, 422, 503},
    }
    for (method, path), expected in statuses.items():
        assert {int(code) for code in paths[path][method]["responses"]} == expected, (method, path)
