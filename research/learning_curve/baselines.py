"""The baselines of a round, on the examples the labeller has labelled, computed in-process with the library.

- knn-interp: the untrained prompted classifier a new task starts from (`task_classifier`: the task's
  template and label words, content-free calibration, the task's k and T, and its lambda, or where the
  task gives none, lambda chosen on the labelled examples each scored leave-one-out, as the service
  chooses it) with a store of the labelled examples;
- prompt-ft: LM-BFF fine-tuning from the pre-trained weights, with the service jobs' training settings,
  trained as the worker trains a job (`Estimator.fit`: dev held out by `dev_split.split_dev`, inference
  chosen on dev);
- setfit: SetFit from its pre-trained encoder (`research.experiments.setfit_peer`: all-mpnet-base-v2;
  `setfit/encoder=minilm`, all-MiniLM-L6-v2; any option spelled as `python -m research eval` takes it),
  with the extra `setfit` installed (`make setfit`).

One backbone serves all of them; its pre-trained weights are put back before and after each training,
so every round starts from scratch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from openbook.backbone import Backbone
from openbook.estimator import Estimator
from openbook.methods import build_method
from openbook.predictions import Embeddings
from openbook.selection import lambda_on_store
from openbook.train_config import TrainConfig

from research.experiments.setfit_peer import (
    PeerUnavailable,
    SetFitConfig,
    SetFitPeer,
    is_peer,
    peer_config,
    peer_spec,
    require_peer,
)
from research.learning_curve.schedule import CurveData
from services.engine.task_spec import Task, task_classifier

BASELINES = ("knn-interp", "prompt-ft", "setfit")


def canonical_baseline(name: str) -> str:
    """A SetFit baseline by its canonical spec (`setfit/encoder=mpnet` is `setfit`); others as given."""
    return peer_spec(peer_config(name)) if is_peer(name) else name


def unavailable(names: Sequence[str]) -> dict[str, str]:
    """Baselines that cannot run here, with why (setfit without its extra or its encoder's packages)."""
    unknown = [name for name in names if name not in BASELINES and not is_peer(name)]
    if unknown:
        known = ", ".join(BASELINES)
        raise ValueError(f"unknown baseline(s) {unknown}; known: {known} (setfit with its options)")
    reasons = {}
    for name in filter(is_peer, names):
        try:
            require_peer(peer_config(name))
        except PeerUnavailable as error:
            reasons[name] = str(error)
    return reasons


class Baselines:
    def __init__(
        self, backbone: Backbone, task: Task, data: CurveData, config: TrainConfig, *, device: str = "cpu"
    ) -> None:
        self.backbone, self.task, self.data, self.config, self.device = backbone, task, data, config, device
        self.initial = {name: t.detach().clone() for name, t in backbone.model.state_dict().items()}
        self.test_texts = [e.text for e in data.test]
        self.test_labels = np.array([list(task.labels).index(e.label) for e in data.test])
        self._untrained_test: Embeddings | None = None  # the test sample under the pre-trained weights

    def accuracy(self, name: str, ids: Sequence[int], seed: int) -> float:
        if is_peer(name):
            predicted = self._setfit(peer_config(name), ids, seed)
        else:
            predicted = {"knn-interp": self._knn_interp, "prompt-ft": self._prompt_ft}[name](ids, seed)
        return float((predicted == self.test_labels).mean())

    def _restore(self) -> None:
        self.backbone.model.load_state_dict(self.initial)

    def _knn_interp(self, ids: Sequence[int], seed: int) -> np.ndarray:
        classifier = task_classifier(self.task, self.backbone)
        if self._untrained_test is None:
            self._untrained_test = classifier.embed(self.test_texts)
        texts = [self.data.train[i].text for i in ids]
        embedded = classifier.embed(texts, vectors_only=True)
        labels = [self.data.train[i].label for i in ids]
        stored = classifier.add_embeddings(embedded, labels, ids, texts=texts)
        if self.task.knn.lam is None:  # as an untrained task chooses it (services/engine/runtime.py)
            classifier.knn = lambda_on_store(classifier, stored, embedded.lm_log_probs)
        return classifier.score(self._untrained_test).probabilities.argmax(-1)

    def _prompt_ft(self, ids: Sequence[int], seed: int) -> np.ndarray:
        self._restore()
        plain = self.task.model_copy(update={"reader": None})  # the prompt alone, whatever the service reads
        estimator = Estimator(task_classifier(plain, self.backbone), build_method("prompt-ft"))
        try:  # as the service's jobs train
            texts, labels = [self.data.train[i].text for i in ids], [self.data.train[i].label for i in ids]
            estimator.fit(texts, labels, ids=ids, **dataclasses.asdict(self.config))
            classifier = estimator.classifier
            return classifier.score(classifier.embed(self.test_texts)).probabilities.argmax(-1)
        finally:
            self._restore()

    def _setfit(self, config: SetFitConfig, ids: Sequence[int], seed: int) -> np.ndarray:
        peer = SetFitPeer(config, device=self.device)  # fresh encoder weights each round
        labels = np.array([list(self.task.labels).index(self.data.train[i].label) for i in ids])
        peer.fit([self.data.train[i].text for i in ids], labels, seed=seed, progress=False)
        return peer.predict_proba(self.test_texts, len(self.task.labels)).argmax(-1)
