"""Many tasks per replica: checkpoints of methods that keep the backbone frozen load onto one copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from openbook.checkpoints import load_classifier

from services.bus.versions import current_checkpoint
from services.trainer.worker import Worker
from tests.services.harness import TASK, TRAINING_EXAMPLES, wait_for

EXAMPLES = TRAINING_EXAMPLES
METHODS = {"probe": "linear-probe", "prompted": "prompt-tuning", "adapted": "lora", "tuned": "prompt-ft"}
TEXTS = ["fun film", "a terrible cast", "great"]


def test_frozen_backbone_tasks_share_one_backbone_and_answer_as_alone(
    make_client, server, causal_dir: Path, tmp_path: Path
) -> None:
    worker = Worker(redis.Redis.from_url(server.url), tmp_path / "artifacts", max_length=48)
    with make_client() as api:
        for name, method in METHODS.items():
            assert api.post("/v1/tasks", json={**TASK, "name": name}).status_code == 201
            body = {"examples": [{"text": t, "label": label} for t, label in EXAMPLES]}
            assert api.post(f"/v1/tasks/{name}/examples", json=body).status_code == 201
            train = {"method": method, "steps": 4, "batch_size": 4, "lr": 1e-3, "eval_every": 2}
            assert api.post(f"/v1/tasks/{name}/train", json=train).status_code == 202
            assert worker.run_once(block_ms=100) is not None
        runtimes = api.app.state.runtimes
        for name in METHODS:
            wait_for(lambda name=name: runtimes.loaded[name].model_version != "base")
        shared = runtimes.backbones.backbone(str(causal_dir))
        served = {name: runtimes.loaded[name].classifier for name in METHODS}

        assert served["probe"].backbone is shared and served["prompted"].backbone is shared
        weights = {name: c.backbone.input_embeddings.weight.data_ptr() for name, c in served.items()}
        # LoRA reads the shared weights through a module tree of its own (see methods/lora.py)
        assert served["adapted"].backbone is not shared
        assert weights["adapted"] == shared.input_embeddings.weight.data_ptr()
        assert served["tuned"].backbone is not shared  # fine-tuned: a copy of its own
        assert weights["tuned"] != shared.input_embeddings.weight.data_ptr()

        for name in METHODS:
            got = api.post(f"/v1/tasks/{name}/classify", json={"texts": TEXTS}).json()
            published = current_checkpoint(api.app.state.redis, name)
            assert published is not None
            alone, _ = load_classifier(published.path)  # on a backbone of its own
            for answer, expected in zip(got["predictions"], alone.predict(TEXTS), strict=True):
                assert answer["probabilities"] == pytest.approx(expected.probabilities, abs=1e-5), name
