"""A replica's classify batch checks its task and reads the examples any replica acknowledged in one Redis
round trip (`TaskRuntime.predict`, `ExampleLog.read_with_spec`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from redis.client import Pipeline

from tests.services.harness import TASK


def count_round_trips(monkeypatch: pytest.MonkeyPatch, client: redis.Redis) -> list[str]:
    """Every round trip `client` makes from now on, by its first command (a pipeline is one); the
    checkpoint follower's blocking XREAD left out: it runs in its own thread, whatever the requests do."""
    trips: list[str] = []
    send, send_pipeline = redis.Redis.execute_command, Pipeline.execute

    def command(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if self.connection_pool is client.connection_pool and str(args[0]).upper() != "XREAD":
            trips.append(str(args[0]).upper())
        return send(self, *args, **options)

    def pipeline(self: Pipeline, *args: Any, **options: Any) -> Any:
        if self.connection_pool is client.connection_pool:
            trips.append("pipeline: " + ", ".join(str(c[0][0]).upper() for c in self.command_stack))
        return send_pipeline(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", command)
    monkeypatch.setattr(Pipeline, "execute", pipeline)
    return trips


def test_a_classify_batch_sees_another_replicas_example_in_one_round_trip(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_client() as a, make_client() as b:
        assert a.post("/v1/tasks", json=TASK).status_code == 201
        classify = {"texts": ["a good film"], "neighbours": True}
        before = b.post("/v1/tasks/reviews/classify", json=classify).json()  # B holds the task
        assert before["predictions"][0]["neighbours"] == []
        example = {"text": "a good film", "label": "1"}
        added = a.post("/v1/tasks/reviews/examples", json={"examples": [example]})
        assert added.status_code == 201

        trips = count_round_trips(monkeypatch, b.app.state.redis)
        answer = b.post("/v1/tasks/reviews/classify", json=classify).json()

    ack = added.json()
    assert [n["id"] for n in answer["predictions"][0]["neighbours"]] == [ack["examples"][0]["id"]]
    assert answer["store_version"] == ack["store_version"]  # B applied A's example before it answered
    assert trips == ["pipeline: HGET, HGET, XRANGE"]  # the spec, the generation and the new entries
