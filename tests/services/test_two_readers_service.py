"""Two readers through the service: a task that names a sentence reader serves P_kNN from the examples'
neighbours in the reader's space before any training; a job tunes the reader with the prompt, publishes
both, and the api swaps them in; a replica started afresh rebuilds the same book and answers the same.
On the tiny causal LM and the tiny random MPNet."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from openbook.sentence_reader import SentenceReader

from services.api.app import create_app
from services.api.settings import Settings
from services.bus.server import EmbeddedRedis
from services.trainer.worker import Worker
from tests.services.harness import TRAINING_EXAMPLES, wait_for

TRAIN = {"method": "prompt-ft", "steps": 4, "batch_size": 4, "lr": 1e-3, "eval_every": 2}
QUERIES = ["fun film", "a dull plot"]


@pytest.fixture()
def server(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


def _settings(server, causal_dir: Path, reader_mpnet_dir: Path) -> Settings:
    return Settings(
        redis_url=server.url,
        default_backbone=str(causal_dir),
        max_length=48,
        model_dirs=[reader_mpnet_dir.parent],
    )


def _task(reader: str) -> dict:
    return {
        "name": "reviews",
        "template": "{text} It was {mask}",
        "labels": {"0": "bad", "1": "good"},
        "reader": reader,
        "training": {"auto": False},
    }


def _classify(api: TestClient) -> dict:
    answer = api.post("/v1/tasks/reviews/classify", json={"texts": QUERIES, "neighbours": True})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_job_trains_both_readers_and_a_restarted_replica_serves_the_same(
    server, causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    settings = _settings(server, causal_dir, reader_mpnet_dir)
    with TestClient(create_app(settings)) as api:
        assert api.post("/v1/tasks", json=_task(str(reader_mpnet_dir))).status_code == 201
        body = {"examples": [{"text": t, "label": label} for t, label in TRAINING_EXAMPLES]}
        assert api.post("/v1/tasks/reviews/examples", json=body).status_code == 201

        untrained = _classify(api)
        assert untrained["model_version"] == "base" and untrained["reader"] == str(reader_mpnet_dir)
        runtime = api.app.state.runtimes.loaded["reviews"]
        assert runtime.classifier.reader is not None and runtime.classifier.reader.layers is None
        for prediction in untrained["predictions"]:
            assert prediction["p_lm"] and prediction["p_knn"] and prediction["neighbours"]

        job = api.post("/v1/tasks/reviews/train", json=TRAIN)
        assert job.status_code == 202, job.text
        worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
        assert worker.run_once(block_ms=100) == job.json()["id"]
        record = api.get(f"/v1/jobs/{job.json()['id']}").json()
        assert record["state"] == "succeeded", record
        version = record["published"]["version"]
        wait_for(lambda: api.app.state.runtimes.loaded["reviews"].model_version == version)

        trained = _classify(api)
        runtime = api.app.state.runtimes.loaded["reviews"]
        reader = runtime.classifier.reader
        assert reader is not None and reader.layers is not None  # the job's tuned top layers, swapped in
        assert trained["model_version"] == version and trained["reader"] == str(reader_mpnet_dir)
        for before, after in zip(untrained["predictions"], trained["predictions"], strict=True):
            assert after["p_lm"] and after["p_knn"] and after["neighbours"]
            assert after["p_knn"] != before["p_knn"]  # the tuned reader reads other neighbours' weights
        book = runtime.classifier.knn_book()
        assert sorted(book.ids().tolist()) == sorted(runtime.classifier.store.ids().tolist())
        readers = api.get("/v1/tasks/reviews/report").json()["readers"]  # each reader alone, on dev
        assert readers["book_keyed_by"] == str(reader_mpnet_dir)
        assert readers["prompt"] is not None and readers["book"] is not None

        # where the version's job found queries out of scope (on dev): every prediction says, and the task
        # refuses them once told to, in place
        chosen = runtime.classifier.min_similarity
        versions = api.get("/v1/tasks/reviews/versions").json()["versions"]
        assert chosen is not None
        assert next(v for v in versions if v["version"] == version)["dev_metrics"]["min_similarity"] == chosen
        for prediction in trained["predictions"]:
            assert prediction["out_of_scope"] == (prediction["neighbours"][0]["similarity"] < chosen)
        runtime.classifier.min_similarity = 2.0  # above any cosine: every query out of scope
        flagged = _classify(api)["predictions"]
        assert all(p["out_of_scope"] and p["label"] is not None and not p["abstained"] for p in flagged)
        for refuse in (True, False):
            assert api.patch("/v1/tasks/reviews", json={"refuse_out_of_scope": refuse}).status_code == 200
            answered = _classify(api)["predictions"]
            assert all((p["label"] is None) == p["abstained"] == refuse for p in answered), answered
        runtime.classifier.min_similarity = chosen

    # a replica started afresh: the checkpoint and the log's replay rebuild the same book, keyed by the
    # reader before the first request (which then embeds its own texts only)
    embedded: list[str] = []
    embed = SentenceReader.embed
    monkeypatch.setattr(
        SentenceReader, "embed", lambda self, texts: embedded.extend(texts) or embed(self, texts)
    )
    with TestClient(create_app(settings)) as api:
        wait_for(api.app.state.runtimes.warmed.is_set)
        wait_for(lambda: api.app.state.runtimes.loaded["reviews"].model_version == version)
        embedded.clear()
        again = _classify(api)
        assert sorted(embedded) == sorted(QUERIES)
        for first, second in zip(trained["predictions"], again["predictions"], strict=True):
            assert second["label"] == first["label"]
            assert second["probabilities"] == pytest.approx(first["probabilities"], abs=1e-5)
            assert second["p_knn"] == pytest.approx(first["p_knn"], abs=1e-5)
            assert [n["id"] for n in second["neighbours"]] == [n["id"] for n in first["neighbours"]]

        # a second task on the same reader shares its base encoder: only its top layers are its own (the
        # trained task's cut lower, at all the layers, its examples few: the same weights in memory)
        assert (
            api.post("/v1/tasks", json={**_task(str(reader_mpnet_dir)), "name": "other"}).status_code == 201
        )
        assert api.post("/v1/tasks/other/classify", json={"texts": QUERIES}).status_code == 200
        loaded = api.app.state.runtimes.loaded
        other, reviews = loaded["other"].classifier.reader.base, loaded["reviews"].classifier.reader.base
        assert other.model is reviews.model and other.cut > reviews.cut == 0


def test_a_reader_the_service_may_not_load_is_refused(
    server, causal_dir: Path, reader_mpnet_dir: Path
) -> None:
    with TestClient(create_app(_settings(server, causal_dir, reader_mpnet_dir))) as api:
        for reader in ("sentence-transformers/all-MiniLM-L6-v2", "/etc", str(reader_mpnet_dir.parent)):
            answer = api.post("/v1/tasks", json=_task(reader))
            assert answer.status_code == 422, answer.text
            assert "reader" in answer.text
        assert api.get("/v1/tasks/reviews").status_code == 404  # nothing half-written


def test_a_task_gets_the_services_reader_unless_it_names_one_or_none(
    server, causal_dir: Path, reader_mpnet_dir: Path, sentence_mpnet_dir: Path
) -> None:
    # the operator's default reader, a folder outside model_dirs, as the default backbone may be
    settings = _settings(server, causal_dir, sentence_mpnet_dir).model_copy(
        update={"default_reader": str(reader_mpnet_dir)}
    )
    with TestClient(create_app(settings)) as api:
        unnamed = {key: value for key, value in _task("").items() if key != "reader"}
        created = api.post("/v1/tasks", json=unnamed)
        assert created.status_code == 201, created.text
        assert created.json()["reader"] == str(reader_mpnet_dir)

        created = api.post("/v1/tasks", json={**_task("none"), "name": "plain"})
        assert created.status_code == 201 and created.json()["reader"] is None, created.text
        tasks = {task["name"]: task["reader"] for task in api.get("/v1/tasks").json()}
        assert tasks == {"reviews": str(reader_mpnet_dir), "plain": None}
        for name, reader in tasks.items():  # and each serves with it
            served = api.post(f"/v1/tasks/{name}/classify", json={"texts": QUERIES})
            assert served.status_code == 200 and served.json()["reader"] == reader, served.text


@pytest.mark.parametrize("reader", ["tuned", "none"])
def test_the_gate_compares_on_dev_examples_the_serving_version_did_not_learn(
    server, causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path, reader: str
) -> None:
    """A version whose reader was tuned again on every example (dev included) has learnt the labels of its
    job's dev examples, which stay in dev for the next job: the gate leaves them out, and only them. A
    version without a reader learnt its train part alone, so the gate compares on all of dev."""
    worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
    with TestClient(create_app(_settings(server, causal_dir, reader_mpnet_dir))) as api:
        name = str(reader_mpnet_dir) if reader == "tuned" else "none"
        assert api.post("/v1/tasks", json=_task(name)).status_code == 201
        rounds = [
            [(f"{text} , take {n}", label) for n in takes for text, label in TRAINING_EXAMPLES]
            for takes in ((1, 2), (3, 4))
        ]
        gates, devs = [], []
        for examples, force in zip(rounds, (True, False), strict=True):  # the first served whatever it scores
            body = {"examples": [{"text": t, "label": label} for t, label in examples]}
            assert api.post("/v1/tasks/reviews/examples", json=body).status_code == 201
            job = api.post("/v1/tasks/reviews/train", json={**TRAIN, "force": force}).json()
            assert worker.run_once(block_ms=100) == job["id"]
            record = api.get(f"/v1/jobs/{job['id']}").json()
            assert record["state"] == "succeeded", record
            gates.append(record["gate"])
            devs.append(record["metrics"]["dev"])
    first, second = gates
    assert devs[0] >= 1 and devs[1] > devs[0]  # the first job's dev examples are in the second's dev
    assert first["verdict"] == "forced" and first["left_out"] == 0
    if reader == "tuned":
        assert second["left_out"] == devs[0] and second["dev"] == devs[1] - devs[0], second
    else:
        assert second["left_out"] == 0 and second["dev"] == devs[1], second
    assert second["serving_version"] is not None and second["verdict"] in ("promoted", "rejected")
