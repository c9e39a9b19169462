"""The OpenAPI document is the contract: every status a route answers is declared, with its error shape."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.services.harness import PAIR_TASK, TASK

ERROR = {"$ref": "#/components/schemas/Error"}
VALIDATION = {"$ref": "#/components/schemas/HTTPValidationError"}

# Every status each route can answer (405 aside: it belongs to a path, not to an operation). FastAPI
# declares 422 on every route with parameters, even where a plain string path parameter cannot fail.
STATUSES = {
    ("get", "/livez"): {200},
    ("get", "/readyz"): {200, 503},
    ("post", "/v1/tasks"): {201, 400, 401, 403, 409, 413, 422, 503},
    ("get", "/v1/tasks"): {200, 401, 403, 503},
    ("get", "/v1/tasks/{task}"): {200, 401, 403, 404, 409, 422, 503},
    ("patch", "/v1/tasks/{task}"): {200, 400, 401, 403, 404, 409, 413, 422, 503},
    ("delete", "/v1/tasks/{task}"): {204, 401, 403, 404, 422, 503},
    ("post", "/v1/tasks/{task}/labels"): {201, 400, 401, 403, 404, 409, 413, 422, 503},
    ("delete", "/v1/tasks/{task}/labels/{label}"): {200, 401, 403, 404, 409, 422, 503},
    ("post", "/v1/tasks/{task}/examples"): {201, 400, 401, 403, 404, 409, 413, 422, 503},
    ("get", "/v1/tasks/{task}/examples"): {200, 401, 403, 404, 409, 422, 503},
    ("delete", "/v1/tasks/{task}/examples/{example_id}"): {204, 401, 403, 404, 409, 422, 503},
    ("patch", "/v1/tasks/{task}/examples/{example_id}"): {200, 400, 401, 403, 404, 409, 413, 422, 503},
    ("get", "/v1/tasks/{task}/report"): {200, 202, 401, 403, 404, 409, 422, 503},
    ("post", "/v1/tasks/{task}/classify"): {200, 400, 401, 403, 404, 409, 413, 422, 503},
    ("post", "/v1/tasks/{task}/demonstrations"): {200, 400, 401, 403, 404, 409, 413, 422, 503},
    ("post", "/v1/tasks/{task}/train"): {202, 400, 401, 403, 404, 409, 413, 422, 503},
    ("get", "/v1/jobs/{job_id}"): {200, 401, 403, 404, 422, 503},
    ("get", "/v1/tasks/{task}/jobs"): {200, 401, 403, 404, 409, 422, 503},
    ("post", "/v1/tasks/{task}/pool"): {201, 400, 401, 403, 404, 409, 413, 422, 503},
    ("get", "/v1/tasks/{task}/pool"): {200, 401, 403, 404, 409, 422, 503},
    ("get", "/v1/tasks/{task}/suggestions"): {200, 401, 403, 404, 409, 422, 503},
    ("get", "/v1/tasks/{task}/versions"): {200, 401, 403, 404, 409, 422, 503},
    ("post", "/v1/tasks/{task}/versions/{version}/promote"): {200, 401, 403, 404, 409, 422, 503},
    ("patch", "/v1/tasks/{task}/versions/{version}"): {200, 400, 401, 403, 404, 409, 413, 422, 503},
}


@pytest.fixture()
def api(make_client):
    with make_client(max_batch=4, max_text_chars=100) as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        assert client.post("/v1/tasks", json=PAIR_TASK).status_code == 201
        yield client


def test_every_status_is_declared_with_its_schema(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    declared = {(method, path) for path, item in paths.items() for method in item}
    assert declared == set(STATUSES)
    for (method, path), statuses in STATUSES.items():
        responses = paths[path][method]["responses"]
        assert {int(code) for code in responses} == statuses, (method, path)
        for code in statuses & {400, 401, 403, 404, 409, 413}:
            assert responses[str(code)]["content"]["application/json"]["schema"] == ERROR, (
                method,
                path,
                code,
            )
        if 422 in statuses:
            assert responses["422"]["content"]["application/json"]["schema"] == VALIDATION
    assert "retry-after" in {h.lower() for h in paths["/v1/tasks"]["post"]["responses"]["503"]["headers"]}


@pytest.mark.parametrize(
    ("path", "body", "loc", "says"),
    [
        ("/v1/tasks/reviews/classify", {"texts": [["a", "b"]]}, ["body", "texts", 0], "single texts"),
        ("/v1/tasks/pairs/classify", {"texts": ["a"]}, ["body", "texts", 0], "pairs"),
        ("/v1/tasks/reviews/classify", {"texts": ["a" * 101]}, ["body", "texts", 0], "100 characters"),
        (
            "/v1/tasks/reviews/examples",
            {"examples": [{"text": "fine", "label": "1"}, {"text": "x", "label": "7"}]},
            ["body", "examples", 1, "label"],
            "unknown label '7'",
        ),
        (
            "/v1/tasks",
            {**TASK, "name": "bad", "template": "{mask} first {text}"},
            ["body"],  # a causal backbone needs the slot last: the template and the backbone together
            "last",
        ),
        ("/v1/tasks/reviews/train", {"method": "no-such-method"}, ["body", "method"], "no-such-method"),
    ],
)
def test_the_apps_own_422s_have_the_validation_shape(
    api: TestClient, path: str, body: dict, loc: list, says: str
) -> None:
    response = api.post(path, json=body)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == loc and says in error["msg"] and error["type"] == "value_error"
    # all or none: the valid example beside the bad one was not stored, and no task was made
    assert api.get("/v1/tasks/reviews/examples").json()["examples"] == []
    assert "bad" not in [task["name"] for task in api.get("/v1/tasks").json()]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/tasks", "GET, POST"),
        ("OPTIONS", "/v1/tasks/reviews", "DELETE, GET, PATCH"),
        ("PATCH", "/v1/tasks/reviews/examples", "GET, POST"),
        ("GET", "/v1/tasks/reviews/classify", "POST"),
        ("POST", "/v1/jobs/abc", "GET"),
        ("DELETE", "/livez", "GET"),
    ],
)
def test_a_wrong_method_is_told_every_method_the_path_allows(
    api: TestClient, method: str, path: str, allowed: str
) -> None:
    response = api.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed and response.json() == {"detail": "Method Not Allowed"}


def test_errors_other_than_422_are_a_detail_string(api: TestClient) -> None:
    for code, response in (
        (404, api.get("/v1/tasks/nope")),
        (404, api.get("/v1/jobs/nope")),
        (
            413,
            api.post(
                "/v1/tasks/reviews/classify",
                content=b"x" * 2_000_000,
                headers={"content-type": "application/json"},
            ),
        ),
        (409, api.post("/v1/tasks", json={**TASK, "template": "{text} Overall: {mask}"})),
    ):
        assert response.status_code == code and set(response.json()) == {"detail"}, response.text
        assert isinstance(response.json()["detail"], str)


def test_the_declared_bounds_of_an_id_are_the_ones_enforced(api: TestClient) -> None:
    # JSON Schema tools read a bound as a double; one a double cannot hold (2**63-1) moves, and the
    # contract then promises an id the app refuses.
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    declared = next(s for s in schemas["ExampleIn"]["properties"]["id"]["anyOf"] if s["type"] == "integer")
    top = int(declared["maximum"])
    examples = [{"text": "fine", "label": "1", "id": top}]
    assert api.post("/v1/tasks/reviews/examples", json={"examples": examples}).status_code == 201
    examples[0]["id"] = top + 1
    assert api.post("/v1/tasks/reviews/examples", json={"examples": examples}).status_code == 422
