"""Mixed-task batches in the service: concurrent requests for LoRA tasks on one backbone share a forward,
and each request gets what its own task answers alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from services.trainer.worker import Worker
from tests.services.harness import TASK, TRAINING_EXAMPLES, wait_for

TASKS = {
    "reviews": TASK,
    "verdicts": {
        "name": "verdicts",
        "template": "{text} The film was {mask}",
        "labels": {"no": "terrible", "yes": "great"},
    },
    "plain": {**TASK, "name": "plain"},  # untrained: no adapters, so it runs on its own
}
LABELS = {"reviews": {"0": "0", "1": "1"}, "verdicts": {"0": "no", "1": "yes"}}
TEXTS = [["fun film"], ["a terrible cast", "great"], ["boring and bad"]]


def test_lora_tasks_share_a_forward_and_each_request_gets_its_own_tasks_answer(
    make_client, server, tmp_path: Path
) -> None:
    worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
    with make_client(batch_max_wait_ms=50, batch_max_delay_ms=200) as api:
        for spec in TASKS.values():
            assert api.post("/v1/tasks", json=spec).status_code == 201
        for name, labels in LABELS.items():
            body = {"examples": [{"text": t, "label": labels[label]} for t, label in TRAINING_EXAMPLES]}
            assert api.post(f"/v1/tasks/{name}/examples", json=body).status_code == 201
            train = {"method": "lora", "steps": 4, "batch_size": 4, "lr": 1e-2, "eval_every": 2}
            assert api.post(f"/v1/tasks/{name}/train", json=train).status_code == 202
            assert worker.run_once(block_ms=100) is not None
        loaded = api.app.state.runtimes.loaded
        for name in LABELS:
            wait_for(lambda name=name: loaded[name].model_version != "base")
        runtimes = {name: loaded[name] for name in LABELS}
        mixer = runtimes["reviews"].mixer
        assert mixer is not None and mixer is runtimes["verdicts"].mixer
        assert all(runtime.mixes() for runtime in runtimes.values())

        def classify(ask: tuple[str, list[str]]) -> dict[str, Any]:
            response = api.post(f"/v1/tasks/{ask[0]}/classify", json={"texts": ask[1]})
            assert response.status_code == 200, response.text
            return response.json()

        asks = [(name, texts) for name in TASKS for texts in TEXTS]
        alone = [classify(ask) for ask in asks]  # one at a time: each its own forward
        mixed_forwards: list[list[int]] = []
        predict = mixer.predict

        def recording(parts: Any) -> Any:
            mixed_forwards.append([len(texts) for _, texts in parts])
            return predict(parts)

        mixer.predict = recording  # type: ignore[method-assign]
        for _ in range(3):  # until concurrent requests of two LoRA tasks have met in one forward
            with ThreadPoolExecutor(len(asks)) as pool:
                together = list(pool.map(classify, asks * 2))
            for got, expected in zip(together, alone * 2, strict=True):
                assert got["model_version"] == expected["model_version"]
                for answer, want in zip(got["predictions"], expected["predictions"], strict=True):
                    assert answer["label"] == want["label"]
                    assert answer["probabilities"] == pytest.approx(want["probabilities"], abs=1e-5)
            if mixed_forwards:
                break
        assert mixed_forwards, "no forward served two LoRA tasks at once"
        assert not loaded["plain"].mixes()


def test_mixed_batches_can_be_turned_off(make_client) -> None:
    with make_client(mixed_batches=False) as api:
        assert api.post("/v1/tasks", json=TASK).status_code == 201
        assert api.post("/v1/tasks/reviews/classify", json={"texts": ["fun"]}).status_code == 200
        assert api.app.state.runtimes.loaded["reviews"].mixer is None
