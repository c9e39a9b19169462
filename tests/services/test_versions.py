"""The promotion gate, versions, promotion (rollback), pinning and retention, on a real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from services.bus.jobs import Job
from services.bus.keys import TASKS_KEY
from services.bus.versions import (
    Published,
    checkpoints_key,
    current_checkpoint,
    list_versions,
    new_record,
    promote,
    publish_checkpoint,
    retain,
    set_pinned,
)
from services.client import OpenBookClient
from services.engine.task_spec import Task
from services.trainer.gate import METRIC
from services.trainer.worker import Worker
from tests.services.harness import TASK, wait_for

POSITIVE = ["the movie was great and fun", "a good film with a great cast", "great fun", "a good film"]
NEGATIVE = ["it was terrible and boring", "a bad film , it was awful", "boring and bad", "a terrible film"]
# Odd ids positive, even ones negative; ids 9, 10, 12, 21 and 24 fall in dev: both labels are there.
EXAMPLES = [
    {"id": i, "label": "1" if i % 2 else "0", "text": (POSITIVE if i % 2 else NEGATIVE)[i // 2 % 4]}
    for i in range(1, 25)
]
# A good candidate: retroprompt's kNN interpolation finds each dev text's near twins among the train ones.
GOOD = {"method": "retroprompt", "steps": 24, "batch_size": 4, "lr": 1e-2, "eval_every": 4, "patience": 10}
# A worse one, built to be: the untrained tiny LM's prompt alone (prompt-ft predicts without kNN), one
# step at a learning rate too small to move it.
WORSE = {"method": "prompt-ft", "steps": 1, "batch_size": 4, "lr": 1e-9, "eval_every": 1}


# -- the gate, through the api and the worker --------------------------------------------------------


@pytest.fixture()
def artifacts(tmp_path: Path) -> Path:
    return tmp_path / "data" / "artifacts"


@pytest.fixture()
def replicas(make_client, tmp_path: Path):
    """Two api replicas on one Redis and one data directory, the task and its EXAMPLES posted; the task
    trains only when asked (these tests' jobs are the ones they start)."""
    with make_client(data_dir=tmp_path / "data") as first, make_client(data_dir=tmp_path / "data") as second:
        manual = {**TASK, "training": {"auto": False}}
        assert first.post("/v1/tasks", json=manual).status_code == 201
        assert first.post("/v1/tasks/reviews/examples", json={"examples": EXAMPLES}).status_code == 201
        yield first, second


def train(api: TestClient, worker: Worker, body: dict) -> dict:
    job = api.post("/v1/tasks/reviews/train", json=body)
    assert job.status_code == 202, job.text
    assert worker.run_once(block_ms=100) == job.json()["id"]
    record = api.get(f"/v1/jobs/{job.json()['id']}").json()
    assert record["state"] == "succeeded", record
    return record


def serves(api: TestClient, version: str) -> bool:
    return api.post("/v1/tasks/reviews/classify", json={"texts": ["fun"]}).json()["model_version"] == version


def test_a_worse_candidate_is_rejected_and_force_skips_the_gate(server, replicas, artifacts) -> None:
    api, _ = replicas
    client = redis.Redis.from_url(server.url)
    worker = Worker(client, artifacts, max_length=48)
    first = train(api, worker, GOOD)
    assert first["gate"]["verdict"] == "first" and first["gate"]["dev"] == 5
    serving = first["published"]["version"]
    wait_for(lambda: serves(api, serving))

    worse = train(api, worker, WORSE)
    gate = worse["gate"]
    assert gate["verdict"] == "rejected" and gate["candidate"] < gate["serving"], gate
    assert gate["serving_version"] == serving and gate["metric"] == METRIC and gate["dev"] == 5
    assert worse["published"] is None  # never on the checkpoints stream: no replica can serve it
    assert (
        client.xlen(checkpoints_key("reviews")) == 1
        and current_checkpoint(client, "reviews").version == serving
    )
    assert serves(api, serving)
    listed = api.get("/v1/tasks/reviews/versions").json()
    assert listed["serving"] == serving
    (rejected, kept) = listed["versions"]  # newest first
    assert (rejected["state"], rejected["job"], rejected["gate"]) == ("rejected", worse["id"], gate)
    assert kept["version"] == serving and kept["state"] == "serving" and kept["method"] == "retroprompt"
    assert rejected["examples"] == {"train": 19, "dev": 5} and rejected["size_bytes"] > 0
    assert Path(artifacts / "reviews" / rejected["version"]).is_dir()

    forced = train(api, worker, {**WORSE, "force": True})
    assert forced["force"] and forced["gate"]["verdict"] == "forced" and forced["gate"]["serving"] is None
    wait_for(lambda: serves(api, forced["published"]["version"]))
    states = {v["version"]: v["state"] for v in api.get("/v1/tasks/reviews/versions").json()["versions"]}
    assert states[serving] == "retired" and states[forced["published"]["version"]] == "serving"


def test_a_first_candidate_worse_than_the_untrained_task_is_not_served(server, replicas, artifacts) -> None:
    api, _ = replicas
    client = redis.Redis.from_url(server.url)
    untrained = api.post("/v1/tasks/reviews/classify", json={"texts": ["fun"]}).json()["model_version"]
    worse = train(api, Worker(client, artifacts, max_length=48, untrained_gate=True), WORSE)
    gate = worse["gate"]
    # the untrained task (its prompt and kNN over the train examples) is the serving side of the first gate
    assert gate["verdict"] == "rejected" and gate["serving_version"] is None and gate["dev"] == 5, gate
    assert gate["candidate"] < gate["serving"], gate
    assert worse["published"] is None and current_checkpoint(client, "reviews") is None
    assert client.xlen(checkpoints_key("reviews")) == 0
    assert api.get("/v1/tasks/reviews/versions").json()["serving"] is None
    answer = api.post("/v1/tasks/reviews/classify", json={"texts": ["fun"]}).json()
    assert answer["model_version"] == untrained


def test_a_first_candidate_better_than_the_untrained_task_is_served(server, replicas, artifacts) -> None:
    api, _ = replicas
    client = redis.Redis.from_url(server.url)
    good = train(api, Worker(client, artifacts, max_length=48, untrained_gate=True), GOOD)
    gate = good["gate"]
    # compared with the untrained task, on the same dev examples, and not found worse
    assert gate["verdict"] == "first" and gate["serving_version"] is None and gate["dev"] == 5, gate
    assert isinstance(gate["serving"], float) and gate["candidate"] >= gate["serving"], gate
    version = good["published"]["version"]
    assert current_checkpoint(client, "reviews").version == version
    wait_for(lambda: serves(api, version))


def test_promote_rolls_every_replica_back_and_unknowns_are_404(server, replicas, artifacts) -> None:
    first_api, second_api = replicas
    worker = Worker(redis.Redis.from_url(server.url), artifacts, max_length=48)
    old = train(first_api, worker, {**GOOD, "force": True})["published"]["version"]
    new = train(first_api, worker, {**GOOD, "force": True, "steps": 2})["published"]["version"]
    for api in replicas:
        wait_for(lambda api=api: serves(api, new))

    promoted = first_api.post(f"/v1/tasks/reviews/versions/{old}/promote")
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["version"] == old and promoted.json()["state"] == "serving"
    for api in replicas:  # both follow the checkpoints stream, whichever replica was asked
        wait_for(lambda api=api: serves(api, old))
    listed = second_api.get("/v1/tasks/reviews/versions").json()
    assert listed["serving"] == old
    assert [(v["version"], v["state"]) for v in listed["versions"]] == [(new, "retired"), (old, "serving")]

    pinned = second_api.patch(f"/v1/tasks/reviews/versions/{new}", json={"pinned": True})
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    typed = OpenBookClient(http=second_api)
    assert typed.versions("reviews").versions[0].pinned is True
    assert typed.pin("reviews", new, False).pinned is False
    assert typed.promote("reviews", old).state == "serving"

    for response in (
        first_api.post("/v1/tasks/reviews/versions/nope/promote"),
        first_api.patch("/v1/tasks/reviews/versions/nope", json={"pinned": True}),
        first_api.get("/v1/tasks/missing/versions"),
        first_api.post(f"/v1/tasks/missing/versions/{old}/promote"),
    ):
        assert response.status_code == 404 and isinstance(response.json()["detail"], str)
    assert first_api.patch(f"/v1/tasks/reviews/versions/{new}", json={"pinned": "x"}).status_code == 422
    text = first_api.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith('openbook_artifacts_bytes{task="reviews"}'))
    assert float(line.split()[-1]) > 0


# -- retention, on records and directories made by hand ---------------------------------------------


def _version(client: redis.Redis, artifacts: Path, version: str, created: float, *, serve: bool) -> None:
    path = artifacts / "reviews" / version
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    record = new_record(
        version=version,
        method="prompt-ft",
        job=f"job-{version}",
        gate=None,
        dev_metrics={"accuracy": 1.0},
        train=3,
        dev=1,
        size_bytes=2,
        created=created,
    )
    publish_checkpoint(
        client,
        Job(f"job-{version}", "reviews", "prompt-ft", {}),
        Published(version, str(path), "0" * 64, "1-0"),
        record,
        serve=serve,
    )


def test_retention_keeps_the_serving_the_pinned_and_the_newest(server, artifacts) -> None:
    client = redis.Redis.from_url(server.url)
    client.hset(TASKS_KEY, "reviews", Task(**TASK, backbone="tiny").model_dump_json())
    for n in range(1, 8):  # v1 (oldest) ... v7; v2 serves, v3 is pinned, v5 was rejected
        _version(client, artifacts, f"v{n}", 1000.0 + n, serve=n not in (5, 6, 7))
    promote(client, "reviews", "v2")
    set_pinned(client, "reviews", "v3", True)

    deleted = retain(client, "reviews", artifacts, keep=3)
    assert sorted(deleted) == ["v1", "v4"]
    assert sorted(p.name for p in (artifacts / "reviews").iterdir()) == ["v2", "v3", "v5", "v6", "v7"]
    serving, records = list_versions(client, "reviews")
    assert serving == "v2" and [r["version"] for r in records] == ["v7", "v6", "v5", "v3", "v2"]
    assert {r["version"]: r["state"] for r in records}["v5"] == "rejected"
    assert json.loads(client.get("openbook:task:reviews:current"))["version"] == "v2"

    with pytest.raises(LookupError, match="no version 'v1'"):  # deleted: it cannot be served again
        promote(client, "reviews", "v1")
    assert retain(client, "reviews", artifacts, keep=3) == []  # nothing more to delete
    assert sorted(retain(client, "reviews", artifacts, keep=1)) == ["v5", "v6"]
    assert sorted(p.name for p in (artifacts / "reviews").iterdir()) == ["v2", "v3", "v7"]
