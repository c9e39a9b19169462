"""The api over a real embedded Redis and a tiny random backbone, through FastAPI's test client."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.bus.server import EmbeddedRedis
from tests.services.harness import TASK


@pytest.fixture()
def api(make_client):
    with make_client(max_batch=4, max_text_chars=100, max_body_bytes=5000) as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 201
        yield client


def test_posted_examples_are_neighbours_of_the_next_classify(api: TestClient) -> None:
    examples = [{"text": "a good film", "label": "1", "id": 7}, {"text": "a bad film", "label": "0"}]
    response = api.post("/v1/tasks/reviews/examples", json={"examples": examples})
    assert response.status_code == 201, response.text
    ack = response.json()
    assert [e["id"] for e in ack["examples"]] == [7, 1] and all(e["created"] for e in ack["examples"])

    result = api.post("/v1/tasks/reviews/classify", json={"texts": ["a good film"], "neighbours": True})
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["store_version"] == ack["store_version"] and body["model_version"] == "base"
    (prediction,) = body["predictions"]
    top = prediction["neighbours"][0]
    assert top == {"id": 7, "text": "a good film", "label": "1", "similarity": pytest.approx(1.0, abs=1e-4)}
    assert set(prediction["probabilities"]) == {"0", "1"} and prediction["p_knn"] is not None

    retry = api.post("/v1/tasks/reviews/examples", json={"examples": examples[:1]})
    assert retry.status_code == 201 and retry.json()["examples"] == [{"id": 7, "created": False}]
    page = api.get("/v1/tasks/reviews/examples", params={"limit": 1}).json()
    assert page == {"examples": [{"id": 1, "text": "a bad film", "label": "0"}], "next_after": 1}
    assert api.delete("/v1/tasks/reviews/examples/7").status_code == 204
    assert api.get("/v1/tasks/reviews/examples").json()["examples"] == [
        {"id": 1, "text": "a bad film", "label": "0"}
    ]
    assert api.delete("/v1/tasks/reviews/examples/7").status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "code", "says"),
    [
        ("/v1/tasks/nope/classify", {"texts": ["x"]}, 404, "no task 'nope'"),
        ("/v1/tasks/reviews/classify", {"texts": []}, 422, "at least 1"),
        ("/v1/tasks/reviews/classify", {"texts": ["a"] * 5}, 422, "over the limit of 4"),
        ("/v1/tasks/reviews/classify", {"texts": ["a" * 101]}, 422, "over the limit of 100 characters"),
        ("/v1/tasks/reviews/classify", {"texts": [["a", "b"]]}, 422, "single texts"),
        ("/v1/tasks/reviews/examples", {"examples": [{"text": "x", "label": "7"}]}, 422, "unknown label '7'"),
        ("/v1/tasks/reviews/examples", {"examples": [{"text": "x", "label": "1", "id": -2}]}, 422, "greater"),
        ("/v1/tasks/reviews/examples", {"examples": [{"text": "", "label": "1"}]}, 422, "at least 1"),
        ("/v1/tasks/reviews/classify", {"texts": ["x" * 99] * 60}, 413, "over the limit of 5000"),
    ],
)
def test_bad_requests_get_json_errors(api: TestClient, path: str, body: dict, code: int, says: str) -> None:
    response = api.post(path, json=body)
    assert response.status_code == code, response.text
    assert says in str(response.json()["detail"])
    assert api.get("/v1/tasks/reviews/examples").json()["examples"] == []  # nothing was written


def test_malformed_json_and_conflicts(api: TestClient) -> None:
    response = api.post(
        "/v1/tasks/reviews/classify", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "detail" in response.json()
    assert (
        api.post(
            "/v1/tasks/reviews/examples", json={"examples": [{"text": "a", "label": "1", "id": 3}]}
        ).status_code
        == 201
    )
    changed = api.post(
        "/v1/tasks/reviews/examples", json={"examples": [{"text": "b", "label": "1", "id": 3}]}
    )
    assert changed.status_code == 409 and "different text or label" in changed.json()["detail"]
    assert api.post("/v1/tasks", json=TASK).status_code == 201  # the same spec again: idempotent
    other = api.post("/v1/tasks", json={**TASK, "template": "{text} Overall: {mask}"})
    assert other.status_code == 409
    bad = api.post("/v1/tasks", json={**TASK, "name": "other", "template": "{mask} first {text}"})
    assert bad.status_code == 422 and "last" in bad.json()["detail"][0]["msg"]
    assert api.post("/v1/tasks", json={**TASK, "name": "../etc"}).status_code == 422


def test_api_key_guards_writes(make_client) -> None:
    with make_client(api_key="s3cret") as client:
        assert client.post("/v1/tasks", json=TASK).status_code == 401
        assert client.post("/v1/tasks", json=TASK, headers={"X-API-Key": "wrong"}).status_code == 403
        assert (
            client.post("/v1/tasks", json=TASK, headers={"Authorization": "Bearer s3cret"}).status_code == 201
        )
        listed = client.get("/v1/tasks", headers={"X-API-Key": "s3cret"})  # the write key reads too
        assert listed.json()[0]["name"] == "reviews"


def test_two_replicas_converge_and_redis_down_keeps_classify_serving(
    server: EmbeddedRedis, make_client
) -> None:
    with make_client() as first, make_client() as second:
        first.post("/v1/tasks", json=TASK)
        examples = [
            {"text": t, "label": label}
            for t, label in [("great fun", "1"), ("boring", "0"), ("a good film", "1")]
        ]
        first.post("/v1/tasks/reviews/examples", json={"examples": examples})
        a = first.post("/v1/tasks/reviews/classify", json={"texts": ["fun film"], "neighbours": True}).json()
        b = second.post("/v1/tasks/reviews/classify", json={"texts": ["fun film"], "neighbours": True}).json()
        assert a == b  # same log, same store, same prediction

        server.stop()
        assert second.get("/readyz").status_code == 503
        write = second.post("/v1/tasks/reviews/examples", json={"examples": examples[:1]})
        assert write.status_code == 503 and write.headers["retry-after"] == "1"
        served = second.post("/v1/tasks/reviews/classify", json={"texts": ["fun film"], "neighbours": True})
        assert served.status_code == 200 and served.json()["predictions"] == b["predictions"]


def test_metrics_report_latency_batches_and_stores(api: TestClient) -> None:
    api.post("/v1/tasks/reviews/examples", json={"examples": [{"text": "a good film", "label": "1"}]})
    api.post("/v1/tasks/reviews/classify", json={"texts": ["fine", "dull"]})
    text = api.get("/metrics").text
    route = 'method="POST",route="/v1/tasks/{task}/classify",status="200"'
    assert f"openbook_request_seconds_count{{{route}}} 1.0" in text
    assert "openbook_classify_batch_texts_sum 2.0" in text
    assert 'openbook_store_examples{task="reviews"} 1.0' in text
    assert 'openbook_task_version_info{model="base"' in text


def test_typed_client_round_trip(api: TestClient) -> None:
    from services.api.schemas import ExampleIn
    from services.client import OpenBookClient, OpenBookError

    client = OpenBookClient(http=api)
    ack = client.add_examples("reviews", [ExampleIn(text="a good film", label="1", id=5)])
    assert ack.examples[0].id == 5 and ack.examples[0].created
    result = client.classify("reviews", ["a good film"], neighbours=True)
    assert result.predictions[0].neighbours is not None and result.predictions[0].neighbours[0].id == 5
    with pytest.raises(OpenBookError) as error:
        client.classify("missing", ["x"])
    assert error.value.status == 404 and "no task" in error.value.detail
    client.delete_example("reviews", 5)
    assert client.classify("reviews", ["a good film"]).predictions[0].p_knn is None
    assert list(client.add_label("reviews", "a/b", "what").labels) == ["0", "1", "a/b"]
    assert set(client.classify("reviews", ["a good film"]).predictions[0].probabilities) == {"0", "1", "a/b"}
    assert list(client.remove_label("reviews", "a/b").labels) == ["0", "1"]


def test_the_typed_client_sends_only_the_options_given(api: TestClient) -> None:
    """What `OpenBookClient.train` leaves out, the job takes from the task's training settings."""
    from services.client import OpenBookClient

    client = OpenBookClient(http=api)
    assert api.patch("/v1/tasks/reviews", json={"training": {"steps": 3, "batch_size": 4}}).status_code == 200
    config = client.train("reviews", lr=0.01).train_config
    assert (config["steps"], config["batch_size"], config["lr"]) == (3, 4, 0.01)


def test_demonstrations_per_class_with_weights(api: TestClient) -> None:
    examples = [
        {"text": t, "label": label}
        for t, label in [("a good film", "1"), ("great fun", "1"), ("boring", "0")]
    ]
    api.post("/v1/tasks/reviews/examples", json={"examples": examples})
    body = api.post("/v1/tasks/reviews/demonstrations", json={"text": "a good film"}).json()
    assert body["read_by_model"] is False  # the untrained task's prompt shows none
    by_label = {d["label"]: d["neighbours"] for d in body["demonstrations"]}
    assert [n["text"] for n in by_label["0"]] == ["boring"] and by_label["0"][0]["weight"] == pytest.approx(
        1.0
    )
    assert {n["text"] for n in by_label["1"]} == {"a good film", "great fun"}
    assert sum(n["weight"] for n in by_label["1"]) == pytest.approx(1.0)
    assert by_label["1"][0]["text"] == "a good film"  # the most similar first, and heaviest
    assert by_label["1"][0]["weight"] >= by_label["1"][1]["weight"]


def test_concurrent_classify_requests_share_forwards(make_client) -> None:
    import threading

    with make_client(batch_max_wait_ms=300, batch_max_delay_ms=300) as client:
        client.post("/v1/tasks", json=TASK)
        client.post("/v1/tasks/reviews/examples", json={"examples": [{"text": "a good film", "label": "1"}]})
        texts = ["fine", "dull film", "great fun", "a bad film , it was awful"]
        alone = [client.post("/v1/tasks/reviews/classify", json={"texts": [t]}).json() for t in texts]
        start = threading.Barrier(len(texts))
        together: dict[str, dict] = {}

        def ask(text: str) -> None:
            start.wait()
            together[text] = client.post("/v1/tasks/reviews/classify", json={"texts": [text]}).json()

        threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        metrics = client.get("/metrics").text
        forwards = float(
            next(
                line.split()[-1]
                for line in metrics.splitlines()
                if line.startswith("openbook_forward_batch_texts_count")
            )
        )
        assert forwards < 2 * len(texts)  # 4 alone + the concurrent 4 in fewer than 4 forwards
        for text, single in zip(texts, alone, strict=True):
            batched = together[text]["predictions"][0]
            assert batched["label"] == single["predictions"][0]["label"]
            for label, p in single["predictions"][0]["probabilities"].items():
                assert batched["probabilities"][label] == pytest.approx(p, abs=1e-4)


def test_writes_come_back_when_redis_does(tmp_path: Path, make_client) -> None:
    server = EmbeddedRedis(tmp_path / "bus").start()
    port = server.port
    with make_client(redis_url=server.url) as client:
        client.post("/v1/tasks", json=TASK)
        client.post(
            "/v1/tasks/reviews/examples", json={"examples": [{"text": "a good film", "label": "1", "id": 1}]}
        )
        server.kill()
        down = client.post(
            "/v1/tasks/reviews/examples", json={"examples": [{"text": "boring", "label": "0"}]}
        )
        assert down.status_code == 503
        restarted = EmbeddedRedis(tmp_path / "bus", port=port).start()  # same data, same address
        try:
            again = client.post(
                "/v1/tasks/reviews/examples", json={"examples": [{"text": "boring", "label": "0"}]}
            )
            assert again.status_code == 201, again.text  # the api reconnected by itself
            assert client.get("/readyz").status_code == 200
            ids = [e["id"] for e in client.get("/v1/tasks/reviews/examples").json()["examples"]]
            assert ids == [1, 2]
        finally:
            restarted.stop()


def test_a_restarted_api_loads_and_replays_tasks_before_it_is_ready(make_client) -> None:
    with make_client() as first:
        first.post("/v1/tasks", json=TASK)
        first.post("/v1/tasks/reviews/examples", json={"examples": [{"text": "a good film", "label": "1"}]})
    with make_client() as restarted:
        for _ in range(100):
            if restarted.get("/readyz").status_code == 200:
                break
            time.sleep(0.1)
        assert restarted.get("/readyz").status_code == 200
        runtime = restarted.app.state.runtimes.loaded["reviews"]  # loaded without any request for it
        assert len(runtime.classifier.store) == 1 and runtime.texts == {1: "a good film"}


def test_concurrent_first_requests_build_one_runtime(server: EmbeddedRedis, causal_dir: Path) -> None:
    # The warm-up thread and the first requests all ask for a task not yet loaded: one runtime is
    # built and every caller gets it (a second one would orphan the first one's micro-batcher).
    import redis

    from services.engine.backbones import Backbones
    from services.engine.runtimes import Runtimes
    from services.engine.specs import TaskSpecs
    from services.engine.task_spec import Task

    client = redis.Redis.from_url(server.url)
    specs = TaskSpecs(client, Backbones(max_length=48, device="cpu", default_backbone=str(causal_dir)))
    specs.create(Task(**{**TASK, "backbone": str(causal_dir)}))
    cache = Runtimes(specs)
    with ThreadPoolExecutor(4) as pool:
        runtimes = list(pool.map(lambda _: cache.runtime("reviews"), range(4)))
    assert all(r is runtimes[0] for r in runtimes) and cache.loaded["reviews"] is runtimes[0]


def test_a_task_chooses_how_its_neighbours_are_scored(api: TestClient) -> None:
    assert api.get("/v1/tasks/reviews").json()["knn"]["similarity"] == "centred"  # the default
    plain = {**TASK, "name": "plain", "knn": {"similarity": "cosine"}}
    assert api.post("/v1/tasks", json=plain).status_code == 201
    examples = [{"text": "a good film", "label": "1"}, {"text": "a bad film", "label": "0"}]
    api.post("/v1/tasks/plain/examples", json={"examples": examples})
    api.post("/v1/tasks/reviews/examples", json={"examples": examples})
    runtimes = api.app.state.runtimes.loaded
    assert runtimes["plain"].classifier.knn.similarity == "cosine"
    assert runtimes["reviews"].classifier.knn.similarity == "centred"
    body = {"texts": ["a good film"], "neighbours": True}
    by_cosine = api.post("/v1/tasks/plain/classify", json=body).json()["predictions"][0]["neighbours"]
    assert by_cosine[0]["similarity"] == pytest.approx(1.0, abs=1e-5)  # the text itself, by plain cosine
    centred = api.post("/v1/tasks/reviews/classify", json=body).json()["predictions"][0]["neighbours"]
    assert (
        centred[0]["similarity"] == pytest.approx(1.0, abs=1e-5) and centred[1]["similarity"] < 0
    )  # two keys
    bad = api.post("/v1/tasks", json={**TASK, "name": "bad", "knn": {"similarity": "euclid"}})
    assert bad.status_code == 422 and api.get("/v1/tasks/bad").status_code == 404


def test_a_prompt_with_no_room_for_its_demonstrations_is_refused_before_it_is_stored(
    api: TestClient, causal_dir: Path
) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.prompting import Template, Verbalizer

    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))  # the harness's
    budget = backbone.encoder(Template(TASK["template"]), Verbalizer.parse("0=bad,1=good")).text_budget
    # the plain prompt leaves the text 2 tokens; a label's demonstration pair would take them
    crowded = {
        **TASK,
        "name": "crowded",
        "template": " ".join(["the"] * (budget - 2)) + " " + TASK["template"],
    }
    refused = api.post("/v1/tasks", json={**crowded, "method": "retroprompt/demos=neural"})
    assert refused.status_code == 422 and "template and one demonstration take" in refused.text
    assert api.get("/v1/tasks/crowded").status_code == 404  # nothing written
    assert api.post("/v1/tasks", json=crowded).status_code == 201  # the default shows no demonstrations
