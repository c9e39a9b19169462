"""λ chosen on a classifier's stored examples, each left out in turn, and kept level with its store.

A classifier whose `knn.lam` is None (an untrained one's default, `untrained.py`) predicts with λ chosen
by `selection.lambda_on_store` on the examples its store holds: no dev split exists before training, and
the stored examples, each scored with its neighbours among the others, are all the evidence there is.
The rule reads every stored example's label scores (P_LM of the plain prompt), so the classifier keeps
them here, by id, as its examples come and go (`Classifier.add_embeddings`, `.remove_examples`), and
chooses λ again when the store, the kNN settings or the label bias have changed since it last chose.

Where the scores come free with the forward that gives a store key (one-token label words, label
vectors, a masked backbone), they are kept as the examples are stored. Where they cost a pass over the
label words' tree (`Classifier.scores_words_by_tree`), a caller that cannot wait stores the keys alone
and scores the examples `missing` later, off its request path, handing the scores back with `keep` (the
service does, in a thread: services/engine/lambda_refresh.py). Until every stored example has its
scores, the λ chosen before is served; before any, `UNCHOSEN_LAM`. Arrays in, arrays out: no threads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from openbook.prompting import TextInput
from openbook.selection import StoreReader, lambda_on_store
from openbook.store import KnowledgeStore

# Served until λ has been chosen once: the fixed λ (KnnConfig's default) that choosing it replaced.
UNCHOSEN_LAM = 0.5


@dataclass
class LambdaOnStore:
    """Each stored example's label scores, and the λ chosen on them (`lam`)."""

    scores: dict[int, np.ndarray] = field(default_factory=dict)  # stored id -> (C,) label log-probs
    lam: float = UNCHOSEN_LAM
    _store: KnowledgeStore | None = None  # the store the scores are of: another one starts them afresh
    _checked: tuple[int, np.ndarray] | None = None  # (the store's version, its ids without scores then)
    _chosen_for: tuple | None = None  # what `lam` was chosen for (`_state`)

    def stored(self, store: KnowledgeStore, ids: np.ndarray, lm_log_probs: np.ndarray | None) -> None:
        """Examples were stored (an id stored before was replaced): their scores, None where not taken."""
        self._of(store)
        for example_id in ids.tolist():
            self.scores.pop(example_id, None)
        if lm_log_probs is not None:
            self.scores.update(zip(ids.tolist(), lm_log_probs, strict=True))
        self._checked = None

    def removed(self, ids: np.ndarray) -> None:
        """Examples left the store: their scores go too."""
        for example_id in ids.tolist():
            self.scores.pop(example_id, None)
        self._checked = None

    def unscored(self, store: KnowledgeStore) -> np.ndarray:
        """The stored ids without scores; the scores of ids no longer stored are dropped on the way. Asked
        again of the same store unchanged (every request of a task asks), the answer is kept."""
        self._of(store)
        if self._checked is not None and self._checked[0] == store.version:
            return self._checked[1]
        ids = store.ids()
        stored = set(ids.tolist())
        for gone in [i for i in self.scores if i not in stored]:  # removed past `Classifier.remove_examples`
            del self.scores[gone]
        unscored = np.array([i for i in ids.tolist() if i not in self.scores], dtype=np.int64)
        self._checked = (store.version, unscored)
        return unscored

    def missing(self, store: KnowledgeStore) -> tuple[np.ndarray, list[TextInput]]:
        """The stored examples without scores, and their texts (as the store keeps them), to score."""
        unscored = self.unscored(store)
        return unscored, store.texts_of(unscored) if len(unscored) else []

    def keep(
        self, store: KnowledgeStore, ids: np.ndarray, texts: Sequence[TextInput], lm_log_probs: np.ndarray
    ) -> None:
        """Scores of `missing` examples, taken since: kept for those still stored under the text scored (an
        example deleted and stored again meanwhile under another text is scored again)."""
        if store is not self._store:
            return
        for example_id, text, row in zip(ids.tolist(), texts, lm_log_probs, strict=True):
            if example_id not in self.scores and _stored_text(store, example_id) == text:
                self.scores[example_id] = row
        self._checked = None

    def chosen(self, classifier: StoreReader) -> float:
        """λ for `classifier` (whose state these are), chosen again if its store, kNN settings or label bias
        changed since; while some stored example lacks its scores, the λ chosen before."""
        state = self._state(classifier)
        if state != self._chosen_for and len(self.unscored(classifier.store)) == 0:
            stored = classifier.store.ids()
            rows = np.stack([self.scores[i] for i in stored.tolist()]) if len(stored) else np.zeros((0, 0))
            chosen = lambda_on_store(classifier, stored, rows).lam
            assert chosen is not None
            self.lam, self._chosen_for = chosen, state
        return self.lam

    def _of(self, store: KnowledgeStore) -> None:
        if store is not self._store:
            self.scores, self._store, self._checked, self._chosen_for = {}, store, None, None

    @staticmethod
    def _state(classifier: StoreReader) -> tuple:
        """What λ is chosen from, besides the scores: the store as it stands, k, T and the label bias."""
        bias = classifier.label_bias
        knn = dataclasses.replace(classifier.knn, lam=None)
        return classifier.store, classifier.store.version, knn, None if bias is None else bias.tobytes()


def _stored_text(store: KnowledgeStore, example_id: int) -> TextInput | None:
    """The text `store` keeps under `example_id`; None where it keeps none."""
    try:
        return store.texts_of(np.array([example_id]))[0]
    except KeyError:
        return None
