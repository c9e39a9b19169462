"""Keys with scopes: the write key guards writes and grants reads, the read key guards reads."""

from __future__ import annotations

import logging

import pytest

from tests.services.harness import TASK

WRITE, READ = {"X-API-Key": "w-s3cret"}, {"Authorization": "Bearer r-s3cret"}
EXAMPLE = {"examples": [{"text": "a good film", "label": "1", "id": 1}]}
READS = [
    ("GET", "/v1/tasks", None),
    ("GET", "/v1/tasks/reviews", None),
    ("GET", "/v1/tasks/reviews/examples", None),
    ("POST", "/v1/tasks/reviews/classify", {"texts": ["fine"]}),
    ("POST", "/v1/tasks/reviews/demonstrations", {"text": "fine"}),
    ("GET", "/v1/tasks/reviews/jobs", None),
    ("GET", "/v1/jobs/nope", None),
]
WRITES = [
    ("POST", "/v1/tasks", TASK),
    ("POST", "/v1/tasks/reviews/examples", EXAMPLE),
    ("POST", "/v1/tasks/reviews/train", {}),
    ("PATCH", "/v1/tasks/reviews", {"training": {"every": 4}}),
    ("DELETE", "/v1/tasks/reviews/examples/1", None),
    ("DELETE", "/v1/tasks/reviews", None),
]


def statuses(client, calls, headers=None) -> list[int]:
    return [
        client.request(method, path, json=body, headers=headers).status_code for method, path, body in calls
    ]


def test_a_write_key_alone_closes_reads_too(make_client) -> None:
    with make_client(api_key="w-s3cret") as client:
        assert client.post("/v1/tasks", json=TASK, headers=WRITE).status_code == 201
        assert client.post("/v1/tasks/reviews/examples", json=EXAMPLE, headers=WRITE).status_code == 201
        assert statuses(client, READS) == [401] * len(READS)  # stored texts do not leak
        assert statuses(client, READS, {"X-API-Key": "wrong"}) == [403] * len(READS)
        assert statuses(client, READS, WRITE) == [200, 200, 200, 200, 200, 200, 404]
        assert client.get("/v1/tasks/reviews/examples").headers["www-authenticate"] == "Bearer"
        assert statuses(client, WRITES) == [401] * len(WRITES)
        for path in ("/livez", "/readyz", "/metrics"):
            assert client.get(path).status_code == 200, path  # probes and metrics stay open


def test_the_read_key_reads_and_only_the_write_key_writes(make_client) -> None:
    with make_client(api_key="w-s3cret", read_key="r-s3cret", metrics_need_key=True) as client:
        assert client.post("/v1/tasks", json=TASK, headers=WRITE).status_code == 201
        assert client.post("/v1/tasks/reviews/examples", json=EXAMPLE, headers=WRITE).status_code == 201
        assert statuses(client, READS, READ) == [200, 200, 200, 200, 200, 200, 404]
        assert statuses(client, READS, WRITE) == statuses(client, READS, READ)  # the write key reads too
        assert statuses(client, WRITES, READ) == [403] * len(WRITES)
        assert (
            client.get("/metrics").status_code == 401
            and client.get("/metrics", headers=READ).status_code == 200
        )
        assert client.get("/livez").status_code == 200 and client.get("/readyz").status_code == 200
        assert statuses(client, WRITES, WRITE) == [201, 201, 202, 200, 204, 204]


def test_without_keys_all_is_open_and_a_public_bind_is_warned_about(
    make_client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), make_client() as client:
        assert statuses(client, WRITES[:2]) == [201, 201] and statuses(client, READS[:3]) == [200] * 3
    assert not [r for r in caplog.records if "no write key" in r.getMessage()]  # 127.0.0.1 by default
    with caplog.at_level(logging.WARNING), make_client(host="0.0.0.0"):
        pass
    assert [r for r in caplog.records if "no write key" in r.getMessage()]
