"""`predict_together`: one task's failure stays that task's; a failed mixed forward falls back to each
task on its own."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.mixed import MixedForward
from openbook.prompting import Template, Verbalizer

from services.engine.runtime import StaleRuntime, predict_together
from tests.test_mixed import TEXTS, lora_task


@dataclass
class Runtime:
    """What predict_together reads of a TaskRuntime; `stale` stands for a task changed since lookup."""

    name: str
    classifier: Classifier
    stale: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    model_version: str = "v1"
    offset: str = "1-0"

    @property
    def task(self) -> Any:
        return SimpleNamespace(name=self.name)

    def _ready_to_serve(self) -> None:
        assert self.lock.locked()  # checked under the task's own lock
        if self.stale:
            raise StaleRuntime(self.name)


@pytest.fixture
def runtimes(causal_backbone: Backbone) -> dict[str, Runtime]:
    plain = Classifier(
        causal_backbone, Template("{text} It was {mask}"), Verbalizer.parse("neg=bad,pos=good")
    )
    return {
        "a": Runtime("a", lora_task(causal_backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=1)),
        "b": Runtime(
            "b", lora_task(causal_backbone, "{text} It was {mask}", "neg=bad,pos=good", seed=2), stale=True
        ),
        "c": Runtime("c", plain),  # no adapters: answered on its own
        "d": Runtime("d", lora_task(causal_backbone, "{text} The film was {mask}", "x=great,y=fun", seed=3)),
    }


def _same(got: Any, classifier: Classifier, texts: list[str]) -> None:
    predictions, version, offset = got
    assert (version, offset) == ("v1", "1-0")
    for g, a in zip(predictions, classifier.predict(texts), strict=True):
        np.testing.assert_allclose(list(g.probabilities.values()), list(a.probabilities.values()), atol=1e-5)


def test_a_stale_task_fails_alone_and_the_others_are_answered(causal_backbone, runtimes) -> None:
    mixer = MixedForward(causal_backbone)
    parts = [(runtimes[n], TEXTS[i:]) for i, n in enumerate("dbca")]
    results = predict_together(mixer, parts)  # type: ignore[arg-type]
    assert isinstance(results[1], StaleRuntime)
    for (runtime, texts), got in zip(parts, results, strict=True):
        if runtime.name != "b":
            _same(got, runtime.classifier, list(texts))
    assert not any(r.lock.locked() for r in runtimes.values())


def test_a_failed_mixed_forward_answers_each_task_on_its_own(causal_backbone, runtimes, monkeypatch) -> None:
    mixer = MixedForward(causal_backbone)

    def refuse(_parts: Any) -> Any:
        raise ValueError("one part's texts cannot be encoded")

    monkeypatch.setattr(mixer, "predict", refuse)
    parts = [(runtimes["a"], TEXTS), (runtimes["d"], TEXTS[:2])]
    for (runtime, texts), got in zip(parts, predict_together(mixer, parts), strict=True):  # type: ignore[arg-type]
        _same(got, runtime.classifier, list(texts))
