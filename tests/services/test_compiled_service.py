"""OPENBOOK_COMPILE: the replica compiles the backbones it loads, and answers as it does uncompiled."""

from __future__ import annotations

import pytest

from tests.services.harness import TASK

TEXTS = ["a good film", "it was terrible and boring", "great fun"]


def test_a_compiling_replica_answers_as_an_eager_one(make_client) -> None:
    answers = {}
    for compile_ in (False, True):
        with make_client(compile=compile_, batch_max_texts=4) as api:
            if not compile_:
                assert api.post("/v1/tasks", json=TASK).status_code == 201
            response = api.post("/v1/tasks/reviews/classify", json={"texts": TEXTS})
            assert response.status_code == 200, response.text
            answers[compile_] = response.json()["predictions"]
            compiled = api.app.state.runtimes.loaded["reviews"].classifier.backbone.compiled
            assert (compiled is not None) == compile_
            if compile_:
                assert compiled.row_sizes == [1, 4]  # up to the replica's batch_max_texts
    for eager, got in zip(answers[False], answers[True], strict=True):
        assert got["label"] == eager["label"]
        assert got["probabilities"] == pytest.approx(eager["probabilities"], abs=1e-4)
