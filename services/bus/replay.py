"""Bring a classifier's store up to date with the example log: the store is derived data."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import numpy as np
from openbook.classifier import Classifier

from services.bus.examples_log import LogEntry


def replay(classifier: Classifier, entries: Sequence[LogEntry]) -> str | None:
    """Apply log entries in order (adds are embedded a run at a time); returns the last offset applied.

    An add that a later entry for its id supersedes is skipped: the end state is the same, nothing is
    embedded for nothing, and an example of a label since removed from the task (it had to be deleted
    first) is never asked of a classifier that no longer has the label.
    """
    last = {e.id: i for i, e in enumerate(entries)}
    live = [e for i, e in enumerate(entries) if e.op == "delete" or last[e.id] == i]
    for op, run in groupby(live, key=lambda e: e.op):
        batch = list(run)
        if op == "add":
            classifier.add_examples(
                [e.text for e in batch],  # type: ignore[misc]  # an add always carries text and label
                [e.label for e in batch],  # type: ignore[misc]
                ids=np.array([e.id for e in batch], dtype=np.int64),
            )
        else:
            classifier.store.remove(np.array([e.id for e in batch], dtype=np.int64))
    return entries[-1].offset if entries else None
