"""An untrained task with `knn.lam` null serves λ chosen on its stored examples, each scored leave-one-out
(`selection.lambda_on_store`), chosen again whenever the store changes (the classifier keeps it level:
openbook.lambda_on_store); a λ given in the spec is kept. Where the labels' scores cost a pass over their
words' tree, they and λ follow in a thread of the task's own, off its lock
(services/engine/lambda_refresh.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from openbook.classifier import Classifier
from openbook.selection import lambda_on_store

from services.bus.examples_log import LogEntry
from services.engine.runtime import TaskRuntime
from services.engine.task_spec import Task, task_classifier
from tests.services.harness import CLUSTER_EXAMPLES, CLUSTERS_TASK

EXAMPLES = [e for e in CLUSTER_EXAMPLES if e["label"] == "a" or e["id"] >= 10]  # the two clusters only
EXAMPLES = [e for e in EXAMPLES if e["id"] != 42]


@dataclass
class Log:
    """The example log as TaskRuntime reads it: entries after an offset."""

    entries: list[LogEntry] = field(default_factory=list)

    def add(self, *examples: dict) -> None:
        for e in examples:
            self.entries.append(LogEntry(f"{len(self.entries) + 1}-0", "add", e["id"], e["text"], e["label"]))

    def delete(self, example_id: int) -> None:
        self.entries.append(LogEntry(f"{len(self.entries) + 1}-0", "delete", example_id))

    def read(self, after: str = "0-0", count: int | None = None) -> list[LogEntry]:
        return [e for e in self.entries if int(e.offset.split("-")[0]) > int(after.split("-")[0])]


def _runtime(causal_backbone, lam: float | None, labels: dict | None = None) -> tuple[TaskRuntime, Log]:
    spec = {**CLUSTERS_TASK, "knn": {**CLUSTERS_TASK["knn"], "lam": lam}, "backbone": "tiny"}
    task = Task.model_validate(spec | ({"labels": labels} if labels else {}))
    log = Log()
    return TaskRuntime(task, task_classifier(task, causal_backbone), log), log  # type: ignore[arg-type]


def _expected(runtime: TaskRuntime) -> float:
    """λ by the library's rule, from the stored examples' label scores computed afresh."""
    classifier = runtime.classifier
    ids = classifier.store.ids()
    scores = classifier.embed([runtime.texts[int(i)] for i in ids], vectors_only=True).lm_log_probs
    return lambda_on_store(classifier, ids, scores).lam


def test_lambda_is_chosen_on_the_store_and_again_when_it_changes(causal_backbone):
    runtime, log = _runtime(causal_backbone, None)
    assert not runtime.classifier.scores_words_by_tree  # one-token words: scored with the keys
    runtime.catch_up()
    assert (
        len(runtime.classifier.store) == 0 and runtime.classifier.served_knn().lam == 0.0
    )  # the prompt alone
    log.add(*EXAMPLES[:1])
    runtime.catch_up()
    assert runtime.classifier.served_knn().lam == 0.0  # one example's P_kNN is its label, whatever the query

    log.add(*EXAMPLES[1:])
    runtime.catch_up()
    chosen = runtime.classifier.served_knn().lam
    assert (
        chosen == _expected(runtime) and chosen > 0.5
    )  # the store tells the clusters apart; the prompt does not
    assert sorted(runtime.classifier.lam_on_store.scores) == sorted(e["id"] for e in EXAMPLES)

    for e in EXAMPLES[1:]:
        if e["label"] == "b":
            log.delete(e["id"])
    runtime.catch_up()
    assert sorted(runtime.classifier.lam_on_store.scores) == sorted(
        e["id"] for e in EXAMPLES if e["label"] == "a" or e is EXAMPLES[0]
    )
    assert runtime.classifier.served_knn().lam == _expected(runtime)


def test_labels_added_score_the_stored_examples_again(causal_backbone):
    runtime, log = _runtime(causal_backbone, None)
    log.add(*EXAMPLES)
    runtime.catch_up()
    runtime.grow_labels(runtime.task.model_copy(update={"labels": {**runtime.task.labels, "c": "fun"}}))
    runtime.catch_up()  # no new entry, but a classifier with another label
    assert {row.shape for row in runtime.classifier.lam_on_store.scores.values()} == {(3,)}
    assert runtime.classifier.served_knn().lam == _expected(runtime)


@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_a_lambda_given_in_the_spec_is_kept(causal_backbone, lam):
    runtime, log = _runtime(causal_backbone, lam)
    log.add(*EXAMPLES)
    runtime.catch_up()
    assert runtime.classifier.served_knn().lam == lam and not runtime.classifier.lam_on_store.scores


def test_words_scored_by_tree_are_scored_off_the_lock_while_classify_goes_on(causal_backbone, monkeypatch):
    # words of several tokens on the tiny vocabulary: their scores need the tree pass
    runtime, log = _runtime(causal_backbone, None, {"a": "good fun film", "b": "bad book river"})
    assert runtime.classifier.scores_words_by_tree
    log.add(*EXAMPLES[:3])
    runtime.catch_up()
    assert runtime.lam_refresh.settle(30)
    chosen = runtime.classifier.served_knn().lam

    scoring, release = threading.Event(), threading.Event()
    real_embed = Classifier.embed

    def held(self, texts, **options):  # the refresh's scoring waits until released
        if options.get("vectors_only"):
            scoring.set()
            assert release.wait(30)
        return real_embed(self, texts, **options)

    monkeypatch.setattr(Classifier, "embed", held)
    log.add(*EXAMPLES[3:])
    runtime.catch_up(lambda_wait_s=0)  # the keys are stored; the scores are due
    assert scoring.wait(30) and len(runtime.classifier.store) == len(EXAMPLES)
    assert runtime.lock.acquire(timeout=5)  # the refresh scores off the task's lock: classify goes on
    try:
        assert runtime.offset == log.entries[-1].offset
        assert len(runtime.classifier.predict(["yes the movie was great and fun"])) == 1
    finally:
        runtime.lock.release()
    assert runtime.classifier.served_knn().lam == chosen and not runtime.lam_refresh.settle(0)
    release.set()
    assert runtime.lam_refresh.settle(30)
    monkeypatch.setattr(Classifier, "embed", real_embed)
    assert sorted(runtime.classifier.lam_on_store.scores) == sorted(e["id"] for e in EXAMPLES)
    assert (
        runtime.classifier.served_knn().lam == _expected(runtime)
        and runtime.classifier.served_knn().lam > 0.5
    )
