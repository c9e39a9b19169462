"""λ of an untrained task, chosen on its stored examples and kept level with them off the request path.

An untrained task whose `knn.lam` is null serves λ chosen on its stored examples, each scored leave-one-out
(`selection.lambda_on_store`). That needs every stored example's label scores (P_LM). Where they cost no
more than the forward that gives a store key (one-token label words, label vectors, a masked backbone),
they come from that same forward as the log is replayed, and λ is chosen again at once, under the task's
lock (`scores_for`, `choose`): every replica serves the λ of the store it serves.

Where the labels are multi-token words scored exactly over their token tree (`word_scores.py`), scoring
them is most of the cost of adding an example and grows with the labels: at clinc150's 150 intent names,
11.5 times two labels' cost on a CPU (docs/benchmarks.md, "Many labels"). Replaying the log then stores
the keys alone, and the scores and the new λ follow in a thread of the task's own (`due`), which runs
the forward off the task's lock: classify goes on meanwhile with the λ chosen before (so two replicas
may differ for that long), and a POST of examples answers once they are stored. `settle` waits for λ to
catch up; the api waits up to LAMBDA_WAIT_S after adding examples, so that on a task whose scoring is
quick the next classify already sees it.

The runtime (`services/engine/runtime.py`) calls `scores_for`, `choose`, `due` and `forget` under its lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from openbook.classifier import Classifier
from openbook.prompting import TextInput
from openbook.selection import lambda_on_store

if TYPE_CHECKING:
    from services.engine.runtime import TaskRuntime

logger = logging.getLogger(__name__)

LAMBDA_WAIT_S = 2.0  # how long adding examples waits for λ to catch up before it answers


@dataclass
class LambdaOnStore:
    # each stored example's label scores (id -> (C,)) under `scored_by`, the classifier that scored them
    scores: dict[int, np.ndarray] = field(default_factory=dict)
    scored_by: Classifier | None = None
    _thread: threading.Thread | None = None  # the refresh running, if one is
    _again: bool = False  # the store changed while it ran: it goes round once more
    _settled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._settled.set()

    def scores_for(self, classifier: Classifier) -> dict[int, np.ndarray]:
        """The scores held under `classifier`: none where another classifier scored them (new, or grown
        by labels). Replaying the log keeps them level itself where they are cheap."""
        if self.scored_by is not classifier:
            self.scores.clear()
            self.scored_by = classifier
        return self.scores

    def choose(self, classifier: Classifier, texts: dict[int, TextInput]) -> None:
        """λ from the scores, those of examples stored before `classifier` scored them computed here."""
        ids = classifier.store.ids()
        missing = [i for i in ids.tolist() if i not in self.scores]
        if missing:
            scored = classifier.embed([texts[i] for i in missing], vectors_only=True).lm_log_probs
            self.scores.update(zip(missing, scored, strict=True))
        rows = np.stack([self.scores[i] for i in ids.tolist()]) if len(ids) else np.zeros((0, 0))
        classifier.knn = lambda_on_store(classifier, ids, rows)

    def forget(self) -> None:
        """A trained classifier serves (its λ was chosen on dev): the scores are of no more use."""
        self.scores.clear()
        self.scored_by = None

    def due(self, runtime: TaskRuntime) -> None:
        """The store or the classifier changed: score what is missing and choose λ again, in the thread."""
        self._settled.clear()
        if self._thread is not None:
            self._again = True
            return
        self._thread = threading.Thread(
            target=self._refresh, args=(runtime,), name=f"lambda-{runtime.task.name}", daemon=True
        )
        self._thread.start()

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for λ to reflect the store; whether it does."""
        return self._settled.wait(timeout)

    def _refresh(self, runtime: TaskRuntime) -> None:
        while True:
            with runtime.lock:
                self._again = False
                classifier = runtime.classifier
                if not runtime.chooses_lambda():
                    return self._finish()
                scores = self.scores_for(classifier)  # new, or grown by labels: every score again
                missing = [i for i in classifier.store.ids().tolist() if i not in scores]
                texts = [runtime.texts[i] for i in missing]
            try:  # off the lock: the forward that costs, while classify goes on
                scored = classifier.embed(texts, vectors_only=True).lm_log_probs if texts else None
            except Exception:  # the texts were stored, so this is a fault: keep the λ served
                logger.exception("task %s: scoring the stored examples for λ failed", runtime.task.name)
                with runtime.lock:
                    return self._finish()
            with runtime.lock:
                if runtime.classifier is classifier and runtime.chooses_lambda():
                    if scored is not None:
                        self.scores.update(zip(missing, scored, strict=True))
                    stored = set(classifier.store.ids().tolist())
                    for gone in [i for i in self.scores if i not in stored]:
                        del self.scores[gone]
                    if len(self.scores) == len(stored):  # else examples came meanwhile: round again
                        self.choose(classifier, runtime.texts)
                    else:
                        self._again = True
                if not self._again:
                    return self._finish()

    def _finish(self) -> None:  # the caller holds the runtime's lock
        self._thread = None
        self._settled.set()
