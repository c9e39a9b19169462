"""The thread that keeps an untrained task's λ level with its store, off the request path.

The classifier keeps λ chosen on its stored examples itself (`openbook.lambda_on_store`): it reads every
stored example's label scores. Where they come with the forward that gives a store key, replaying the
log keeps them and λ follows at once. Where the labels are multi-token words scored exactly over their
token tree (`word_scores.py`), scoring them is most of the cost of adding an example and grows with the
labels: at clinc150's 150 intent names, 11.5 times two labels' cost on a CPU (docs/benchmarks.md, "Many
labels"). Replaying the log then stores the keys alone, and `due` starts this thread, which scores the
examples missing off the task's lock: classify goes on meanwhile with the λ chosen before (so two
replicas may differ for that long), and a POST of examples answers once they are stored. `settle` waits
for λ to catch up; the api waits up to LAMBDA_WAIT_S after adding examples, so that on a task whose
scoring is quick the next classify already sees it.

It is given the task's lock and a callable for the classifier to refresh (None once λ is no longer
chosen on the store: a trained version serves), never the runtime itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from openbook.classifier import Classifier

logger = logging.getLogger(__name__)

LAMBDA_WAIT_S = 2.0  # how long adding examples waits for λ to catch up before it answers


class LambdaRefresh:
    def __init__(self, name: str, lock: threading.Lock, current: Callable[[], Classifier | None]) -> None:
        self.name = name
        self.lock = lock  # the task's: `current` is called, and the classifier changed, under it
        self.current = current
        self._thread: threading.Thread | None = None  # the refresh running, if one is
        self._again = False  # the store changed while it ran: it goes round once more
        self._settled = threading.Event()
        self._settled.set()

    def due(self) -> None:
        """The store or the classifier changed: score what is missing, in the thread (the caller holds
        the lock)."""
        self._settled.clear()
        if self._thread is not None:
            self._again = True
            return
        self._thread = threading.Thread(target=self._refresh, name=f"lambda-{self.name}", daemon=True)
        self._thread.start()

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for λ to reflect the store; whether it does."""
        return self._settled.wait(timeout)

    def _refresh(self) -> None:
        while True:
            with self.lock:
                self._again = False
                classifier = self.current()
                if classifier is None:
                    return self._finish()
                ids, texts = classifier.lam_on_store.missing(classifier.store)
            try:  # off the lock: the forward that costs, while classify goes on
                scores = classifier.embed(texts, vectors_only=True).lm_log_probs if texts else None
            except Exception:  # the texts were stored, so this is a fault: keep the λ served
                logger.exception("task %s: scoring the stored examples for λ failed", self.name)
                with self.lock:
                    return self._finish()
            with self.lock:
                if self.current() is classifier:
                    if scores is not None:
                        classifier.lam_on_store.keep(classifier.store, ids, texts, scores)
                    if len(classifier.lam_on_store.unscored(classifier.store)):
                        self._again = True  # examples came meanwhile: round again
                    else:
                        classifier.served_knn()  # λ chosen here, so that classify finds it chosen
                if not self._again:
                    return self._finish()

    def _finish(self) -> None:  # the caller holds the lock
        self._thread = None
        self._settled.set()
