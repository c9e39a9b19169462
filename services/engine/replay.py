"""Bring a classifier's store up to date with the example log: the store is derived data."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import cast

import numpy as np
from openbook.classifier import Classifier
from openbook.prompting import TextInput

from services.bus.examples_log import LogEntry


def replay(
    classifier: Classifier, entries: Sequence[LogEntry], lm_scores: dict[int, np.ndarray] | None = None
) -> str | None:
    """Apply log entries in order (adds are embedded a run at a time); returns the last offset applied.

    `lm_scores`, when given, is kept up to date with each stored example's label scores (id -> (C,)),
    computed by the same forward as its store key; without it no label is scored.

    An add that a later entry for its id supersedes is skipped: the end state is the same, nothing is
    embedded for nothing, and an example of a label since removed from the task (it had to be deleted
    first) is never asked of a classifier that no longer has the label.
    """
    last = {e.id: i for i, e in enumerate(entries)}
    live = [e for i, e in enumerate(entries) if e.op == "delete" or last[e.id] == i]
    for op, run in groupby(live, key=lambda e: e.op):
        batch = list(run)
        ids = np.array([e.id for e in batch], dtype=np.int64)
        if op == "add":
            texts = [cast(TextInput, e.text) for e in batch]  # an add always carries text and label
            labels = [cast(str, e.label) for e in batch]
            classifier.label_indices(labels)  # unknown labels fail before the forward passes
            if lm_scores is None:  # only the store keys: no label is scored
                classifier.add_embeddings(classifier.embed_vectors(texts), labels, ids, texts=texts)
            else:
                embedded = classifier.embed(texts, vectors_only=True)
                classifier.add_embeddings(embedded, labels, ids, texts=texts)
                lm_scores.update(zip(ids.tolist(), embedded.lm_log_probs, strict=True))
        else:
            classifier.store.remove(ids)
            if lm_scores is not None:
                for i in ids.tolist():
                    lm_scores.pop(i, None)
    return entries[-1].offset if entries else None
