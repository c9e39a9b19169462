"""The FAISS backend of `KnowledgeStore` on the CPU: sealed flat shards while small, one IVF index once large.

Search is exact over flat shards until the store reaches ``approx_threshold`` items; it is then rebuilt
as an IVF index, and the recall@10 of that approximation against exact search is measured and kept
(``approx_recall``), so nobody has to guess what it costs. The IVF index is retrained when the store
has grown fourfold since it was built, and the store goes back to flat shards at half the threshold.

Called by `KnowledgeStore` (`store.py`), which validates and normalises what comes in: here ids are
unique non-negative int64, vectors unit-norm float32 rows. `store_torch.TorchKeys` is the same
interface with the keys on a torch device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np

from openbook.prompting.templates import TextInput

# A faiss flat index keeps its vectors in one growing buffer: removing a row moves everything after it,
# and growing the buffer copies all of it. Sealing shards at this size bounds both copies to ~37 MB at
# dim 576 instead of the whole store (measured: 26 ms -> 4 ms per single-id remove at 100k items).
DEFAULT_SHARD_SIZE = 16_384
RECALL_SAMPLE_SIZE = 512
RECALL_K = 10
# k-means gives stable centroids from ~39 points each (faiss warns below that); more than 64 per
# centroid only makes training slower without making the coarse quantizer noticeably better.
MIN_POINTS_PER_CENTROID = 39
MAX_POINTS_PER_CENTROID = 64


@dataclass
class StoreState:
    """What a snapshot holds besides the settings: the faiss indexes, the sorted id arrays and the texts."""

    kind: str  # "flat" (sealed shards) or "ivf" (one index)
    indexes: list[faiss.Index]
    ids: np.ndarray  # int64 (N,), sorted
    labels: np.ndarray  # int64 (N,), aligned with ids
    index_of: np.ndarray  # int64 (N,), which index holds each id
    ivf_built_at: int
    texts: dict[int, TextInput] = field(default_factory=dict)  # id -> text, for the entries that have one
    approx_recall: float | None = None  # the IVF index's measured recall@10; None when flat


class FaissKeys:
    """Unit vectors with unique int64 ids and int64 labels, searched by inner product with FAISS."""

    def __init__(
        self,
        dim: int,
        *,
        approx_threshold: int,
        nprobe: int,
        seed: int,
        shard_size: int = DEFAULT_SHARD_SIZE,
    ) -> None:
        self.dim = int(dim)
        self.approx_threshold, self.nprobe = int(approx_threshold), int(nprobe)
        self.seed, self.shard_size = int(seed), int(shard_size)
        self.kind = "flat"
        self.approx_recall: float | None = None
        # Flat: a list of IndexIDMap2 shards, only the last one open for adds. IVF: exactly one index.
        self._indexes: list[faiss.Index] = []
        # Sorted ids with aligned labels and positions in _indexes, so hit lookups are one searchsorted.
        self._ids = np.zeros(0, dtype=np.int64)
        self._labels = np.zeros(0, dtype=np.int64)
        self._index_of = np.zeros(0, dtype=np.int64)
        self._ivf_built_at = 0
        self._changes = 0  # counts adds and removals: the per-label search parameters are cached per value
        self._label_cache: tuple[tuple[int, int], list[Any], list[Any], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def index_count(self) -> int:
        """How many faiss indexes a search visits (flat shards, or the one IVF index)."""
        return len(self._indexes)

    def sorted_ids(self) -> np.ndarray:
        """The stored ids, sorted (the array itself, not a copy)."""
        return self._ids

    def contains(self, ids: np.ndarray) -> np.ndarray:
        positions = np.searchsorted(self._ids, ids)
        found = positions < len(self._ids)
        found[found] = self._ids[positions[found]] == ids[found]
        return found

    def vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """(N, D) float32 stored vectors; every id must be stored."""
        found = self.contains(ids)
        if not found.all():
            raise KeyError(f"id {int(ids[~found][0])} is not stored")
        holders = self._index_of[np.searchsorted(self._ids, ids)]
        vectors = np.empty((len(ids), self.dim), dtype=np.float32)
        for holder in np.unique(holders):
            rows = np.flatnonzero(holders == holder)
            vectors[rows] = self._indexes[holder].reconstruct_batch(np.ascontiguousarray(ids[rows]))
        return vectors

    def labels_of(self, ids: np.ndarray) -> np.ndarray:
        """The label of each id; every id must be stored."""
        return self._labels[np.searchsorted(self._ids, ids)]

    def add(self, ids: np.ndarray, vectors: np.ndarray, labels: np.ndarray) -> None:
        """Upsert `ids` (unique). IndexIDMap2 would keep a duplicate id, so a stored one is removed first."""
        order = np.argsort(ids, kind="stable")
        ids, vectors, labels = ids[order], vectors[order], labels[order]
        self._drop(ids[self.contains(ids)])
        self._insert(ids, vectors, labels)
        self._changes += 1
        self._maybe_change_kind()

    def remove(self, ids: np.ndarray) -> None:
        """Drop the stored ones of `ids` (unique), touching only the shards that hold them."""
        ids = np.sort(ids)
        self._drop(ids[self.contains(ids)])
        self._changes += 1
        self._maybe_change_kind()

    def _insert(self, ids: np.ndarray, vectors: np.ndarray, labels: np.ndarray) -> None:
        """Add ids that are not stored yet (sorted, unique) to the index and the lookup arrays."""
        if self.kind == "ivf":
            self._indexes[0].add_with_ids(vectors, ids)
            holders = np.zeros(len(ids), dtype=np.int64)
        else:
            holders = self._append_to_flat_shards(ids, vectors)
        positions = np.searchsorted(self._ids, ids)
        self._ids = np.insert(self._ids, positions, ids)
        self._labels = np.insert(self._labels, positions, labels)
        self._index_of = np.insert(self._index_of, positions, holders)

    def _append_to_flat_shards(self, ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        holders = np.empty(len(ids), dtype=np.int64)
        start = 0
        while start < len(ids):
            if not self._indexes or self._indexes[-1].ntotal >= self.shard_size:
                self._indexes.append(faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim)))
            tail = self._indexes[-1]
            stop = min(len(ids), start + self.shard_size - tail.ntotal)
            tail.add_with_ids(vectors[start:stop], ids[start:stop])
            holders[start:stop] = len(self._indexes) - 1
            start = stop
        return holders

    def _drop(self, ids: np.ndarray) -> None:
        """Remove ids known to be stored (sorted, unique)."""
        if len(ids) == 0:
            return
        positions = np.searchsorted(self._ids, ids)
        holders = self._index_of[positions]
        for holder in np.unique(holders):
            self._indexes[holder].remove_ids(np.ascontiguousarray(ids[holders == holder]))
        self._ids = np.delete(self._ids, positions)
        self._labels = np.delete(self._labels, positions)
        self._index_of = np.delete(self._index_of, positions)
        if self.kind == "flat":
            # Forget sealed shards that churn emptied, so searches don't keep visiting them.
            empty = [i for i, index in enumerate(self._indexes[:-1]) if index.ntotal == 0]
            if empty:
                self._indexes = [index for i, index in enumerate(self._indexes) if i not in empty]
                self._index_of -= np.searchsorted(np.array(empty, dtype=np.int64), self._index_of)

    def _maybe_change_kind(self) -> None:
        count = len(self)
        if self.kind == "flat" and count >= self.approx_threshold:
            self._build_ivf()
        elif self.kind == "ivf" and count < self.approx_threshold // 2:
            # Hysteresis: going back only at half the threshold keeps a store hovering near it from flapping.
            self._build_flat(self._stored_vectors())
        elif self.kind == "ivf" and count >= 4 * self._ivf_built_at:
            self._build_ivf()  # nlist was sized for a much smaller store; retrain for the current size

    def _stored_vectors(self) -> np.ndarray:
        return self.vectors_of(self._ids) if len(self) else np.zeros((0, self.dim), np.float32)

    def _build_flat(self, vectors: np.ndarray) -> None:
        self._indexes, self.kind, self.approx_recall = [], "flat", None
        self._index_of = self._append_to_flat_shards(self._ids, vectors)

    def _build_ivf(self) -> None:
        vectors = self._stored_vectors()
        count = len(vectors)
        nlist = int(np.clip(round(4 * np.sqrt(count)), 16, 65536))
        nlist = max(1, min(nlist, count // MIN_POINTS_PER_CENTROID))
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = self.seed
        ivf.cp.spherical = True  # centroids of unit vectors should be unit vectors for inner-product routing
        ivf.cp.max_points_per_centroid = MAX_POINTS_PER_CENTROID
        ivf.train(vectors)
        # A hash-table direct map lets remove_ids and reconstruct find an id without scanning every list.
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]  # not in faiss's stubs
        ivf.nprobe = self.nprobe
        ivf.add_with_ids(vectors, self._ids)
        self.approx_recall = self._measure_recall(ivf, vectors)
        self._indexes, self.kind, self._ivf_built_at = [ivf], "ivf", count
        self._index_of = np.zeros(count, dtype=np.int64)

    def _measure_recall(self, ivf: faiss.Index, vectors: np.ndarray) -> float:
        """recall@10 of the IVF index against exact search, with a sample of stored vectors as queries."""
        rng = np.random.default_rng(self.seed)
        sample = rng.choice(len(vectors), size=min(RECALL_SAMPLE_SIZE, len(vectors)), replace=False)
        k = min(RECALL_K, len(vectors))
        _, exact_rows = faiss.knn(vectors[sample], vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
        _, approx_ids = ivf.search(vectors[sample], k)
        found = (approx_ids[:, :, None] == self._ids[exact_rows][:, None, :]).any(axis=2)
        return float(found.mean())

    def _search_indexes(
        self, queries: np.ndarray, width: int, params: Any = None, use: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One faiss call per (used, non-empty) index; candidate columns are concatenated, unsorted."""
        similarities, ids = [np.zeros((len(queries), 0), np.float32)], [np.zeros((len(queries), 0), np.int64)]
        for position, index in enumerate(self._indexes):
            if index.ntotal == 0 or (use is not None and not use[position]):
                continue
            shard_similarities, shard_ids = index.search(queries, min(width, index.ntotal), params=params)
            similarities.append(shard_similarities)
            ids.append(shard_ids)
        return np.concatenate(similarities, axis=1), np.concatenate(ids, axis=1)

    def _lookup_labels(self, ids: np.ndarray) -> np.ndarray:
        if len(self._ids) == 0:
            return np.full(ids.shape, -1, dtype=np.int64)
        positions = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
        return np.where(ids >= 0, self._labels[positions], -1)

    def search(
        self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(similarities, ids, labels), each (B, k), best first; missing hits are -inf, -1, -1."""
        # One extra candidate per row makes up for the hit that leave-one-out may drop.
        width = k + (exclude is not None)
        similarities, ids = _select_top(*self._search_indexes(queries, width), k, exclude)
        return similarities, ids, self._lookup_labels(ids)

    def search_per_label(
        self, queries: np.ndarray, k: int, num_labels: int, exclude: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every label c < num_labels, the top-k items labelled c: each array is (B, num_labels, k)."""
        shape = (len(queries), num_labels, k)
        ids = np.full(shape, -1, dtype=np.int64)
        similarities = np.full(shape, -np.inf, dtype=np.float32)
        params, counts = self._label_search_params(num_labels)
        width = k + (exclude is not None)
        for label in range(num_labels):
            if counts[label].any():
                candidates = self._search_indexes(queries, width, params[label], use=counts[label] > 0)
                similarities[:, label], ids[:, label] = _select_top(*candidates, k, exclude)
        labels = np.where(ids >= 0, np.arange(num_labels)[None, :, None], -1)
        return similarities, ids, labels

    def _label_search_params(self, num_labels: int) -> tuple[list[Any], np.ndarray]:
        """Per-label faiss search parameters restricting hits to that label, cached until the next change."""
        key = (self._changes, num_labels)
        if self._label_cache is not None and self._label_cache[0] == key:
            return self._label_cache[1], self._label_cache[3]
        # counts[c, i]: items labelled c in index i, so searches skip shards holding none of them.
        counts = np.zeros((num_labels, len(self._indexes)), dtype=np.int64)
        in_range = self._labels < num_labels
        np.add.at(counts, (self._labels[in_range], self._index_of[in_range]), 1)
        order = np.argsort(self._labels, kind="stable")
        bounds = np.searchsorted(self._labels[order], np.arange(num_labels + 1))
        params: list[faiss.SearchParameters] = []
        selectors = []
        for label in range(num_labels):
            members = np.ascontiguousarray(self._ids[order[bounds[label] : bounds[label + 1]]])
            selector = faiss.IDSelectorBatch(len(members), faiss.swig_ptr(members))  # copies the ids
            # Fields set after construction: faiss's stubs lack the keyword constructor its wrappers add.
            label_params: faiss.SearchParameters
            if self.kind == "ivf":
                label_params = ivf_params = faiss.SearchParametersIVF()
                ivf_params.nprobe = self.nprobe
            else:
                label_params = faiss.SearchParameters()
            label_params.sel = selector
            params.append(label_params)
            selectors.append(selector)  # SearchParameters does not keep its selector alive by itself
        self._label_cache = (key, params, selectors, counts)
        return params, counts

    def export_state(self) -> StoreState:
        """The indexes and id arrays as they are (not copies), for snapshots; the store adds the texts."""
        return StoreState(
            self.kind,
            self._indexes,
            self._ids,
            self._labels,
            self._index_of,
            self._ivf_built_at,
            approx_recall=self.approx_recall,
        )

    def restore_state(self, state: StoreState) -> None:
        """Install what :meth:`export_state` returned (read back from a snapshot)."""
        self.kind, self._indexes, self._ivf_built_at = state.kind, state.indexes, state.ivf_built_at
        self._ids, self._labels, self._index_of = state.ids, state.labels, state.index_of
        self.approx_recall = state.approx_recall
        self._changes += 1


def flat_state(
    dim: int, shard_size: int, ids: np.ndarray, vectors: np.ndarray, labels: np.ndarray
) -> StoreState:
    """Flat FAISS shards of the given (sorted, unique) ids, as a store's snapshot state."""
    keys = FaissKeys(dim, approx_threshold=len(ids) + 1, nprobe=1, seed=0, shard_size=shard_size)
    keys._ids, keys._labels = ids, labels
    keys._build_flat(vectors)
    return keys.export_state()


def _select_top(
    similarities: np.ndarray, ids: np.ndarray, k: int, exclude: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Merge candidate columns into the k best per row, dropping each row's excluded id."""
    missing = max(0, k - ids.shape[1])  # fewer candidates than k: pad, and the padding sorts last
    ids = np.pad(ids.astype(np.int64), ((0, 0), (0, missing)), constant_values=-1)
    # faiss pads missing hits with -1 and a huge negative score; make that an unambiguous -inf.
    similarities = np.pad(similarities, ((0, 0), (0, missing)))
    similarities = np.where(ids >= 0, similarities, -np.inf).astype(np.float32)
    if exclude is not None:
        excluded = ids == exclude[:, None]
        similarities[excluded], ids[excluded] = -np.inf, -1
    # Real hits are cosines >= -1, so sorting by -similarity pushes padding and exclusions to the end;
    # a stable sort keeps tie order deterministic for a given shard layout.
    order = np.argsort(-similarities, axis=1, kind="stable")[:, :k]
    similarities = np.take_along_axis(similarities, order, axis=1)
    return similarities, np.take_along_axis(ids, order, axis=1)
