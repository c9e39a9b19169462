"""The book as the second reader reads it: the store's examples keyed by a sentence reader's embeddings.

A classifier with a sentence reader (`Classifier.reader`, `sentence_reader.py`) reads its kNN from the
examples of its store keyed by the reader's unit sentence embeddings rather than by the prompt's slot
vectors: the cloze prompt gives P_LM, the reader's neighbours give P_kNN, and λ mixes the two as it
mixes the slot store's (chosen on the stored examples, left out in turn, before training; on dev after).
The slot store stays what the prompt's own machinery reads (RetroPrompt's demonstrations and its
kNN-guided training loss).

`ReaderBook.of(store)` is that second key set, kept level with the store it is asked about: under the
same ids, labels and texts, embedded by the reader when first asked after they were stored (a store's
`version` tells whether anything changed). The store must keep its examples' texts. One lock: the
book is brought level by one thread at a time; reading a book while it is brought level is the store's
own concurrency (`store.py`).
"""

from __future__ import annotations

import threading

import numpy as np

from openbook.prompting import TextInput
from openbook.sentence_reader import SentenceReader
from openbook.store import KnowledgeStore


class ReaderBook:
    """The examples of a store, keyed by `reader`'s embeddings (`of`)."""

    def __init__(self, reader: SentenceReader) -> None:
        self.reader = reader
        self._keys: KnowledgeStore | None = None
        self._store: KnowledgeStore | None = None  # the store `_keys` follows
        self._version = -1  # its version when `_keys` was last brought level
        self._entries: dict[int, tuple[TextInput, int]] = {}  # id -> (text, label) as embedded
        self._lock = threading.Lock()

    def of(self, store: KnowledgeStore) -> KnowledgeStore:
        """`store`'s examples keyed by the reader: the same ids and labels, embedded where new or changed
        since last asked. ValueError for an example stored without its text."""
        with self._lock:
            if self._keys is None or store is not self._store:
                self._keys = KnowledgeStore(self.reader.base.hidden_size, device=self.reader.base.device)
                self._store, self._version, self._entries = store, -1, {}
            if store.version != self._version:
                self._level(store)
                self._version = store.version
            return self._keys

    def _level(self, store: KnowledgeStore) -> None:
        assert self._keys is not None
        ids = store.ids()
        stored = set(ids.tolist())
        gone = np.array([i for i in self._entries if i not in stored], dtype=np.int64)
        if len(gone):
            self._keys.remove(gone)
            for example_id in gone.tolist():
                del self._entries[example_id]
        if not len(ids):
            return
        try:
            texts = store.texts_of(ids)
        except KeyError:
            raise ValueError(
                "a sentence reader reads the examples' texts: store them with their texts"
            ) from None
        labels = store.labels_of(ids).tolist()
        changed = [
            row
            for row, (example_id, text, label) in enumerate(zip(ids.tolist(), texts, labels, strict=True))
            if self._entries.get(example_id) != (text, label)
        ]
        if not changed:
            return
        changed_texts = [texts[row] for row in changed]
        vectors = self.reader.embed([as_string(text) for text in changed_texts])
        self._keys.add(ids[changed], vectors, np.asarray([labels[row] for row in changed]))
        self._entries.update((int(ids[row]), (texts[row], labels[row])) for row in changed)


def as_string(text: TextInput) -> str:
    """A pair's two texts read as one by the sentence encoder (a pair task's neighbours are pairs)."""
    return text if isinstance(text, str) else " ".join(text)
