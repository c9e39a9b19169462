"""Bring a classifier's store up to date with the example log: the store is derived data."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from openbook.classifier import Classifier

from services.bus.examples_log import LogEntry, fold


def replay(classifier: Classifier, entries: Sequence[LogEntry]) -> str | None:
    """Apply log entries (`examples_log.fold`: what they leave, each id's last entry winning); returns the
    last offset applied.

    The ids they delete leave the store, and the examples they leave are embedded in one pass: nothing is
    embedded for an add a later entry supersedes, and an example of a label since removed from the task (it
    had to be deleted first) is never asked of a classifier that no longer has the label.

    Where the classifier chooses λ on its stored examples (`knn.lam` None), their label scores come from
    the forward that gives the keys (`Classifier.add_examples`), unless scoring the labels costs a pass over
    their words' tree (`scores_words_by_tree`): then the keys alone are stored here, and the scores follow
    off the request path (services/engine/lambda_refresh.py).
    """
    folded = fold(entries)
    if folded.deleted:
        classifier.remove_examples(np.array(sorted(folded.deleted), dtype=np.int64))
    if folded.examples:
        ids = np.array(list(folded.examples), dtype=np.int64)
        texts = [text for text, _ in folded.examples.values()]
        labels = [label for _, label in folded.examples.values()]
        if classifier.knn.lam is None and classifier.scores_words_by_tree:
            classifier.label_indices(labels)  # unknown labels fail before the forward passes
            classifier.add_embeddings(classifier.embed_vectors(texts), labels, ids, texts=texts)
        else:
            classifier.add_examples(texts, labels, ids)
    return folded.offset
