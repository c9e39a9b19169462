"""A task's quality report over HTTP, relabelling a suspect, and abstention below `min_confidence`."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import redis

from services.engine import runtime as runtime_module
from services.trainer.worker import Worker
from tests.services.harness import CLUSTER_EXAMPLES, CLUSTERS_TASK, MISLABELLED, TRAINING_EXAMPLES, wait_for

TASK = CLUSTERS_TASK


def _examples() -> list[dict]:
    return [dict(row) for row in CLUSTER_EXAMPLES]


def _brute_force_checks(report: dict) -> None:
    matrix = np.array(report["confusion"]["matrix"])
    assert matrix.sum() == report["examples"]
    assert report["accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum())
    for c, label in enumerate(report["confusion"]["labels"]):
        assert report["per_label"][label]["support"] == matrix[c].sum()
    assert sum(b["count"] for b in report["reliability"]) == report["examples"]
    assert report["coverage"][0] == {"threshold": 0.0, "coverage": 1.0, "accuracy": report["accuracy"]}
    labels = report["confusion"]["labels"]
    for pair in report["confused_pairs"]:  # each one an off-diagonal cell, the largest first
        assert pair["label"] != pair["predicted"]
        assert matrix[labels.index(pair["label"]), labels.index(pair["predicted"])] == pair["count"] > 0
    counts = [pair["count"] for pair in report["confused_pairs"]]
    assert counts == sorted(counts, reverse=True)
    assert sum(counts) == matrix.sum() - np.trace(matrix)  # a few labels: every confusion listed


def test_report_finds_the_mislabelled_example_and_relabelling_it_clears_it(make_client) -> None:
    with make_client() as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert api.get("/v1/tasks/clusters/report").status_code == 409  # nothing labelled yet
        assert api.post("/v1/tasks/clusters/examples", json={"examples": _examples()}).status_code == 201

        report = api.get("/v1/tasks/clusters/report").json()
        assert report["scored_by"] == "leave-one-out" and report["model_version"] == "base"
        assert report["examples"] == 11
        _brute_force_checks(report)
        top = report["suspect_examples"][0]
        assert (top["id"], top["label"], top["predicted"]) == (MISLABELLED, "b", "a")
        assert top["text"] == "the movie was great and fun" and top["confidence"] > 0.9
        assert report["calibration"]["folds"] == 5
        readers = report["readers"]
        assert readers["book_keyed_by"] == "slot vectors" and 0 <= readers["lam"] <= 1
        assert 0 <= readers["prompt"] <= 1 and 0 <= readers["book"] <= 1

        relabelled = api.patch(f"/v1/tasks/clusters/examples/{MISLABELLED}", json={"label": "a"})
        assert relabelled.status_code == 200, relabelled.text
        example = {"id": MISLABELLED, "text": "the movie was great and fun", "label": "a"}
        assert relabelled.json()["example"] == example
        after = api.get("/v1/tasks/clusters/report").json()
        assert after["store_version"] == relabelled.json()["store_version"] != report["store_version"]
        assert MISLABELLED not in [s["id"] for s in after["suspect_examples"]]
        assert after["accuracy"] > report["accuracy"] and after["examples"] == 11
        assert after["readers"]["book"] > report["readers"]["book"]  # its neighbours agree with it now
        page = api.get("/v1/tasks/clusters/examples", params={"limit": 1000}).json()["examples"]
        assert {e["id"]: e["label"] for e in page}[MISLABELLED] == "a"


def test_a_report_that_takes_long_answers_its_progress_until_it_is_done(make_client, monkeypatch) -> None:
    """`wait=false`: 202 with the examples scored so far while the leave-one-out pass runs (one pass,
    however many ask), then the report itself; without it, the request waits, as before."""
    chunks = threading.Semaphore(0)  # each chunk of the pass waits for the test to let it run
    passes: list[int] = []
    scored_alone = runtime_module.leave_one_out

    def held(*args, **kwargs):
        passes.append(len(args[1]))
        assert chunks.acquire(timeout=30)
        return scored_alone(*args, **kwargs)

    monkeypatch.setattr(runtime_module, "LOO_CHUNK", 4)
    monkeypatch.setattr(runtime_module, "leave_one_out", held)
    with make_client() as api:
        api.post("/v1/tasks", json=TASK)
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})

        def ask() -> tuple[int, dict]:
            response = api.get("/v1/tasks/clusters/report", params={"wait": "false"})
            if response.status_code == 202:
                assert response.headers["retry-after"] == "1"
            return response.status_code, response.json()

        status, pending = ask()
        assert status == 202 and pending["task"] == "clusters"  # starting, or on its first chunk
        status, pending = wait_for(lambda: (answer := ask())[1].get("examples") == 11 and answer)
        assert (pending["scored"], pending["examples"], pending["progress"]) == (0, 11, 0.0)
        assert pending["stage"] == "leave-one-out"
        chunks.release()  # the first 4 of 11
        status, pending = wait_for(lambda: (answer := ask())[1].get("scored") == 4 and answer)
        assert status == 202 and pending["progress"] == round(4 / 11, 4) and pending["elapsed_s"] >= 0
        chunks.release(2)
        status, report = wait_for(lambda: (answer := ask())[0] == 200 and answer)
        assert report["scored_by"] == "leave-one-out" and report["examples"] == 11
        assert passes == [4, 4, 3]  # one pass for every request that asked
        assert api.get("/v1/tasks/clusters/report").json() == report  # the scores kept: no second pass
        assert passes == [4, 4, 3]


def test_a_report_done_between_two_polls_answers_the_next(make_client, monkeypatch) -> None:
    """However long the report takes to compute, a poll after it is done gets it: never 202 for ever."""
    from services.api.routes import report as report_route

    monkeypatch.setattr(report_route, "PATIENCE_S", 0.0)  # a request never waits: only what is done answers
    with make_client() as api:
        api.post("/v1/tasks", json=TASK)
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})
        first = api.get("/v1/tasks/clusters/report", params={"wait": "false"})
        assert first.status_code == 202
        done = wait_for(
            lambda: (
                (r := api.get("/v1/tasks/clusters/report", params={"wait": "false"})).status_code == 200 and r
            )
        )
        assert done.json() == api.get("/v1/tasks/clusters/report").json()


def test_relabelling_refuses_what_it_cannot_do_and_writes_nothing(make_client) -> None:
    with make_client() as api:
        api.post("/v1/tasks", json=TASK)
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})
        entries = api.app.state.runtimes.loaded["clusters"].log.read()
        assert api.patch("/v1/tasks/clusters/examples/999", json={"label": "a"}).status_code == 404
        assert api.patch("/v1/tasks/clusters/examples/0", json={"label": "zzz"}).status_code == 422
        assert api.patch("/v1/tasks/clusters/examples/0", json={}).status_code == 422
        assert api.patch("/v1/tasks/clusters/examples/0", json={"label": "a"}).status_code == 200  # as it is
        assert api.app.state.runtimes.loaded["clusters"].log.read() == entries


def test_abstention_follows_the_threshold_of_the_request_then_the_task(make_client) -> None:
    with make_client() as api:
        api.post("/v1/tasks", json=TASK)
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})
        texts = [CLUSTER_EXAMPLES[0]["text"], CLUSTER_EXAMPLES[5]["text"], "fun film"]
        plain = api.post("/v1/tasks/clusters/classify", json={"texts": texts}).json()["predictions"]
        assert all(not p["abstained"] and p["label"] is not None for p in plain)
        confidence = [max(p["probabilities"].values()) for p in plain]
        threshold = float(np.median(confidence))
        asked = api.post("/v1/tasks/clusters/classify", json={"texts": texts, "min_confidence": threshold})
        assert asked.json()["min_confidence"] == threshold
        for p, c, before in zip(asked.json()["predictions"], confidence, plain, strict=True):
            assert p["abstained"] == (c < threshold)
            assert p["label"] == (None if c < threshold else before["label"])
            assert p["probabilities"] == before["probabilities"]  # kept when abstaining

        assert api.patch("/v1/tasks/clusters", json={"min_confidence": 1.0}).json()["min_confidence"] == 1.0
        answer = api.post("/v1/tasks/clusters/classify", json={"texts": texts}).json()
        assert answer["min_confidence"] == 1.0
        by_task = answer["predictions"]
        assert [p["abstained"] for p in by_task] == [c < 1.0 for c in confidence]
        overridden = api.post("/v1/tasks/clusters/classify", json={"texts": texts, "min_confidence": None})
        assert not any(p["abstained"] for p in overridden.json()["predictions"])  # null: never, this once
        assert api.get("/v1/tasks/clusters/report").json()["min_confidence"] == 1.0


@pytest.mark.parametrize("bad", [1.5, -0.1, "high", True])
def test_bad_thresholds_get_a_422_and_change_nothing(make_client, bad) -> None:
    with make_client() as api:
        api.post("/v1/tasks", json={**TASK, "min_confidence": 0.3})
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})
        before = api.get("/v1/tasks/clusters").json()
        assert api.patch("/v1/tasks/clusters", json={"min_confidence": bad}).status_code == 422
        classify = api.post("/v1/tasks/clusters/classify", json={"texts": ["x"], "min_confidence": bad})
        assert classify.status_code == 422
        created = api.post("/v1/tasks", json={**TASK, "name": "other", "min_confidence": bad})
        assert created.status_code == 422
        assert api.get("/v1/tasks/clusters").json() == before
        assert api.get("/v1/tasks/other").status_code == 404


def test_non_finite_thresholds_get_a_422(make_client) -> None:
    with make_client() as api:
        api.post("/v1/tasks", json=TASK)
        for literal in ("NaN", "Infinity", "-Infinity"):
            body = f'{{"texts": ["x"], "min_confidence": {literal}}}'
            answer = api.post(
                "/v1/tasks/clusters/classify", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 422, literal
            patch = api.patch(
                "/v1/tasks/clusters",
                content=f'{{"min_confidence": {literal}}}',
                headers={"content-type": "application/json"},
            )
            assert patch.status_code == 422, literal
        assert api.get("/v1/tasks/clusters").json()["min_confidence"] is None
        assert api.patch("/v1/tasks/clusters", json={}).status_code == 422  # nothing to change


def test_a_trained_version_reports_on_its_dev_split(make_client, server, tmp_path) -> None:
    artifacts = tmp_path / "artifacts"
    with make_client(artifacts_dir=artifacts) as api:
        task = {"name": "reviews", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
        api.post("/v1/tasks", json={**task, "training": {"auto": False}})  # the job is the one started here
        rows = [{"text": t, "label": label, "id": i} for i, (t, label) in enumerate(TRAINING_EXAMPLES * 2)]
        rows = [{**r, "text": f"{r['text']} ({r['id']})"} for r in rows]  # 16 distinct examples
        api.post("/v1/tasks/reviews/examples", json={"examples": rows})
        job = api.post("/v1/tasks/reviews/train", json={"steps": 2, "batch_size": 4, "eval_every": 1}).json()
        worker = Worker(redis.Redis.from_url(server.url), artifacts, max_length=48)
        assert worker.run_once(block_ms=100) == job["id"]
        record = api.get(f"/v1/jobs/{job['id']}").json()
        assert record["state"] == "succeeded", record
        version = record["published"]["version"]
        wait_for(lambda: api.get("/v1/tasks/reviews/report").json()["model_version"] == version)

        report = api.get("/v1/tasks/reviews/report").json()
        assert report["scored_by"] == "dev" and report["examples"] == record["metrics"]["dev"]
        _brute_force_checks(report)
        manifest = json.loads((artifacts / "reviews" / version / "manifest.json").read_text())
        dev_ids = manifest["dev_scores"]["ids"]
        assert sorted(dev_ids) == sorted(i for i in range(16) if _in_dev(i))
        calibration = record["metrics"]["calibration"]
        assert report["calibration"]["temperature"] == pytest.approx(calibration["temperature"])
        assert report["calibration"]["ece_before"] == pytest.approx(
            calibration["ece_before"], abs=1e-5
        )  # 6 decimals kept
        dev_metrics = manifest["dev_metrics"]
        assert report["readers"] == {
            "prompt": dev_metrics["accuracy"],
            "book": dev_metrics["accuracy_knn_alone"],
            "lam": manifest["knn"]["lam"],
            "book_keyed_by": "slot vectors",
        }
        assert api.get("/v1/tasks/reviews/report", params={"version": version}).json() == report
        assert api.get("/v1/tasks/reviews/report", params={"version": "nope"}).status_code == 404
        assert api.get("/v1/tasks/reviews/report", params={"version": "../x"}).status_code == 422


def _in_dev(example_id: int) -> bool:
    from openbook.dev_split import in_dev

    return in_dev(example_id)


def test_a_label_added_to_the_task_is_in_the_next_report(make_client) -> None:
    with make_client() as api:
        api.post("/v1/tasks", json={**TASK, "knn": {"k": 3, "temperature": 0.01, "lam": 0.5}})  # P_LM counts
        api.post("/v1/tasks/clusters/examples", json={"examples": _examples()})
        before = api.get("/v1/tasks/clusters/report").json()
        assert before["confusion"]["labels"] == ["a", "b"]
        assert api.post("/v1/tasks/clusters/labels", json={"label": "c", "word": "okay"}).status_code == 201
        after = api.get("/v1/tasks/clusters/report").json()  # the same log offset, another classifier
        assert after["store_version"] == before["store_version"]
        assert after["confusion"]["labels"] == ["a", "b", "c"] and after["per_label"]["c"]["support"] == 0
        assert np.array(after["confusion"]["matrix"]).sum() == 11
        # scored again, not the pass before: P_LM now spreads over three label words
        assert after["reliability"] != before["reliability"]
