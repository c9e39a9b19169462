"""A FAISS store of L2-normalised "slot vectors", each with a stable id, a class label and maybe its text.

The text is what textual demonstrations (`demonstrations.py`) write into a prompt; it travels with the
entry (an upsert without a text leaves the entry without one, a removal drops it) and with snapshots.

Similarity is the inner product of unit vectors, i.e. cosine similarity. Small stores search exactly,
over flat shards; once a store reaches ``approx_threshold`` items it is rebuilt as an IVF index and the
recall@10 of that approximation is measured and kept, so nobody has to guess what it costs.

On a CUDA device the keys live on the GPU instead (`store_torch.py`): exact search at every size, one
matrix product per batch. Snapshots are written in the FAISS format either way (`to` converts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import faiss
import numpy as np
import numpy.typing as npt
import torch

from openbook.prompting.templates import TextInput
from openbook.store_torch import TorchKeys

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

Backend = Literal["auto", "faiss", "torch"]  # auto: torch on a CUDA device, faiss on the CPU


@dataclass(frozen=True)
class SearchResult:
    """Neighbours of each query, most similar first. A missing hit is id -1, label -1, similarity -inf."""

    ids: np.ndarray  # int64, (B, k) or (B, num_labels, k)
    labels: np.ndarray  # int64, same shape
    similarities: np.ndarray  # float32, same shape


def _as_ids(values: npt.ArrayLike, name: str, *, non_negative: bool) -> np.ndarray:
    """Validate a 1-D array of integer ids or labels and return it as int64."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be integers, got dtype {array.dtype}")
    with np.errstate(invalid="ignore"):
        as_int64 = array.astype(np.int64)
    # The round trip rejects 3.5, nan and values beyond int64 instead of silently truncating them.
    if not (as_int64 == array).all():
        raise ValueError(f"{name} must be integers that fit in int64")
    if non_negative and (as_int64 < 0).any():
        raise ValueError(f"{name} must be non-negative, got {as_int64[as_int64 < 0][0]}")
    return as_int64


def _unit_rows(values: npt.ArrayLike, dim: int, name: str) -> np.ndarray:
    """Validate an (N, dim) array of finite, non-zero rows and return them L2-normalised as float32."""
    try:
        # Normalise in float64: float32 squares of tiny components would underflow to a zero norm.
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be numeric: {error}") from error
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"{name} must have shape (N, {dim}), got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contain non-finite values")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError(f"{name} row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is a zero vector")
    return np.ascontiguousarray(array / norms, dtype=np.float32)


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


@dataclass
class StoreState:
    """What a snapshot holds besides the settings: the faiss indexes and the sorted id arrays."""

    kind: str  # "flat" (sealed shards) or "ivf" (one index)
    indexes: list[faiss.Index]
    ids: np.ndarray  # int64 (N,), sorted
    labels: np.ndarray  # int64 (N,), aligned with ids
    index_of: np.ndarray  # int64 (N,), which index holds each id
    ivf_built_at: int
    texts: dict[int, TextInput] = field(default_factory=dict)  # id -> text, for the entries that have one


class KnowledgeStore:
    """Unit vectors with stable int64 ids and int64 labels; exact search until it grows large.

    With the torch backend (the default on a CUDA `device`) search is exact at every size and
    ``approx_threshold``, ``nprobe`` and ``shard_size`` only shape the snapshots it writes.
    Not thread-safe: callers that share a store must serialise access themselves.
    """

    def __init__(
        self,
        dim: int,
        *,
        approx_threshold: int = 200_000,
        nprobe: int = 16,
        seed: int = 0,
        shard_size: int = DEFAULT_SHARD_SIZE,
        device: str | torch.device = "cpu",
        backend: Backend = "auto",
    ) -> None:
        for name, value in (
            ("dim", dim),
            ("approx_threshold", approx_threshold),
            ("nprobe", nprobe),
            ("shard_size", shard_size),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self._dim = int(dim)
        self.approx_threshold = int(approx_threshold)
        self.nprobe = int(nprobe)
        self.seed = int(seed)
        self.shard_size = int(shard_size)
        self.metadata: dict[str, Any] = {}
        self.approx_recall: float | None = None
        self.version = 0
        self._kind = "flat"
        # Flat: a list of IndexIDMap2 shards, only the last one open for adds. IVF: exactly one index.
        self._indexes: list[faiss.Index] = []
        # Sorted ids with aligned labels and positions in _indexes, so hit lookups are one searchsorted.
        self._ids = np.zeros(0, dtype=np.int64)
        self._labels = np.zeros(0, dtype=np.int64)
        self._index_of = np.zeros(0, dtype=np.int64)
        self._ivf_built_at = 0
        self._texts: dict[int, TextInput] = {}
        self._label_cache: tuple[tuple[int, int], list[Any], list[Any], np.ndarray] | None = None
        self.device = torch.device(device)
        if backend == "auto":
            backend = "torch" if self.device.type == "cuda" else "faiss"
        if backend not in ("faiss", "torch") or (backend == "faiss" and self.device.type != "cpu"):
            raise ValueError(f"backend {backend!r} cannot run on {self.device} (faiss: cpu; torch: any)")
        self.backend: Backend = backend
        self._keys = TorchKeys(self._dim, self.device) if backend == "torch" else None

    def to(self, device: str | torch.device, backend: Backend = "auto") -> KnowledgeStore:
        """This store on `device` (itself if nothing changes), converted through its snapshot state."""
        moved = KnowledgeStore(
            self._dim,
            approx_threshold=self.approx_threshold,
            nprobe=self.nprobe,
            seed=self.seed,
            shard_size=self.shard_size,
            device=device,
            backend=backend,
        )
        if (moved.device, moved.backend) == (self.device, self.backend):
            return self
        moved.restore_state(self.export_state())
        moved.version, moved.metadata, moved.approx_recall = (
            self.version,
            dict(self.metadata),
            self.approx_recall,
        )
        return moved

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def key_dtype(self) -> str:
        """What the keys are searched in: float16 on CUDA (torch backend), else float32."""
        return "float32" if self._keys is None else str(self._keys.dtype).removeprefix("torch.")

    @property
    def kind(self) -> str:
        return self._kind

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def labels(self) -> np.ndarray:
        return self._labels.copy()

    def contains(self, ids: npt.ArrayLike) -> np.ndarray:
        ids = _as_ids(ids, "ids", non_negative=False)
        positions = np.searchsorted(self._ids, ids)
        found = positions < len(self._ids)
        found[found] = self._ids[positions[found]] == ids[found]
        return found

    def _positions_of(self, ids: np.ndarray) -> np.ndarray:
        found = self.contains(ids)
        if not found.all():
            raise KeyError(f"id {int(ids[~found][0])} is not in the store")
        return np.searchsorted(self._ids, ids)

    def labels_of(self, ids: npt.ArrayLike) -> np.ndarray:
        ids = _as_ids(ids, "ids", non_negative=False)
        return self._labels[self._positions_of(ids)]

    def vectors_of(self, ids: npt.ArrayLike) -> np.ndarray:
        ids = _as_ids(ids, "ids", non_negative=False)
        holders = self._index_of[self._positions_of(ids)]
        if self._keys is not None:
            return self._keys.vectors_of(ids)
        vectors = np.empty((len(ids), self._dim), dtype=np.float32)
        for holder in np.unique(holders):
            rows = np.flatnonzero(holders == holder)
            vectors[rows] = self._indexes[holder].reconstruct_batch(np.ascontiguousarray(ids[rows]))
        return vectors

    def texts_of(self, ids: npt.ArrayLike) -> list[TextInput]:
        """The stored texts of `ids`; KeyError for an id not stored, or stored without its text."""
        ids = _as_ids(ids, "ids", non_negative=False)
        self._positions_of(ids)
        missing = [int(i) for i in ids if int(i) not in self._texts]
        if missing:
            raise KeyError(f"id {missing[0]} is stored without its text (add it with texts=...)")
        return [self._texts[int(i)] for i in ids]

    def add(
        self,
        ids: npt.ArrayLike,
        vectors: npt.ArrayLike,
        labels: npt.ArrayLike,
        texts: Sequence[TextInput] | None = None,
    ) -> None:
        """Upsert: an id already stored is replaced (its text too). Within one batch the last occurrence
        of an id wins."""
        ids = _as_ids(ids, "ids", non_negative=True)
        vectors = _unit_rows(vectors, self._dim, "vectors")
        labels = _as_ids(labels, "labels", non_negative=True)
        lengths = [len(ids), len(vectors), len(labels), *([] if texts is None else [len(texts)])]
        if len(set(lengths)) > 1:
            raise ValueError(f"ids, vectors, labels and texts must have the same length, got {lengths}")
        if len(ids) == 0:
            return
        # np.unique keeps the first occurrence, so run it on the reversed batch to keep the last one.
        _, first_in_reversed = np.unique(ids[::-1], return_index=True)
        keep = len(ids) - 1 - first_in_reversed
        ids, vectors, labels = ids[keep], vectors[keep], labels[keep]
        # faiss IndexIDMap2 happily stores a duplicate id, so an upsert must remove the old copy first.
        self._drop(ids[self.contains(ids)])
        self._insert(ids, vectors, labels)
        if texts is not None:
            self._texts.update(zip(ids.tolist(), [texts[i] for i in keep], strict=True))
        self.version += 1
        self._maybe_change_kind()

    def remove(self, ids: npt.ArrayLike) -> int:
        """Remove the given ids; unknown ids are ignored. Returns how many were actually removed."""
        ids = np.unique(_as_ids(ids, "ids", non_negative=False))
        present = ids[self.contains(ids)]
        if len(present) == 0:
            return 0
        self._drop(present)
        self.version += 1
        self._maybe_change_kind()
        return len(present)

    def _insert(self, ids: np.ndarray, vectors: np.ndarray, labels: np.ndarray) -> None:
        """Add ids that are not in the store yet (sorted, unique) to the index and the lookup arrays."""
        if self._keys is not None:
            self._keys.add(ids, vectors, labels)
            holders = np.zeros(len(ids), dtype=np.int64)
        elif self._kind == "ivf":
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
                self._indexes.append(faiss.IndexIDMap2(faiss.IndexFlatIP(self._dim)))
            tail = self._indexes[-1]
            stop = min(len(ids), start + self.shard_size - tail.ntotal)
            tail.add_with_ids(vectors[start:stop], ids[start:stop])
            holders[start:stop] = len(self._indexes) - 1
            start = stop
        return holders

    def _drop(self, ids: np.ndarray) -> None:
        """Remove ids known to be stored (sorted, unique), touching only the shards that hold them."""
        if len(ids) == 0:
            return
        positions = np.searchsorted(self._ids, ids)
        holders = self._index_of[positions]
        if self._keys is not None:
            self._keys.remove(ids)
        else:
            for holder in np.unique(holders):
                self._indexes[holder].remove_ids(np.ascontiguousarray(ids[holders == holder]))
        self._ids = np.delete(self._ids, positions)
        self._labels = np.delete(self._labels, positions)
        self._index_of = np.delete(self._index_of, positions)
        for dropped in ids.tolist():
            self._texts.pop(dropped, None)
        if self._kind == "flat":
            # Forget sealed shards that churn emptied, so searches don't keep visiting them.
            empty = [i for i, index in enumerate(self._indexes[:-1]) if index.ntotal == 0]
            if empty:
                self._indexes = [index for i, index in enumerate(self._indexes) if i not in empty]
                self._index_of -= np.searchsorted(np.array(empty, dtype=np.int64), self._index_of)

    def _maybe_change_kind(self) -> None:
        count = len(self)
        if self._keys is not None:
            return  # exact on the device at any size
        if self._kind == "flat" and count >= self.approx_threshold:
            self._build_ivf()
        elif self._kind == "ivf" and count < self.approx_threshold // 2:
            # Hysteresis: going back only at half the threshold keeps a store hovering near it from flapping.
            self._build_flat(self._stored_vectors())
        elif self._kind == "ivf" and count >= 4 * self._ivf_built_at:
            self._build_ivf()  # nlist was sized for a much smaller store; retrain for the current size

    def _stored_vectors(self) -> np.ndarray:
        return self.vectors_of(self._ids) if len(self) else np.zeros((0, self._dim), np.float32)

    def _build_flat(self, vectors: np.ndarray) -> None:
        self._indexes, self._kind, self.approx_recall = [], "flat", None
        self._index_of = self._append_to_flat_shards(self._ids, vectors)

    def _build_ivf(self) -> None:
        vectors = self._stored_vectors()
        count = len(vectors)
        nlist = int(np.clip(round(4 * np.sqrt(count)), 16, 65536))
        nlist = max(1, min(nlist, count // MIN_POINTS_PER_CENTROID))
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self._dim), self._dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = self.seed
        ivf.cp.spherical = True  # centroids of unit vectors should be unit vectors for inner-product routing
        ivf.cp.max_points_per_centroid = MAX_POINTS_PER_CENTROID
        ivf.train(vectors)
        # A hash-table direct map lets remove_ids and reconstruct find an id without scanning every list.
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        ivf.nprobe = self.nprobe
        ivf.add_with_ids(vectors, self._ids)
        self.approx_recall = self._measure_recall(ivf, vectors)
        self._indexes, self._kind, self._ivf_built_at = [ivf], "ivf", count
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

    def _prepare(
        self, queries: npt.ArrayLike, k: int, exclude_ids: npt.ArrayLike | None
    ) -> tuple[np.ndarray, int, np.ndarray | None]:
        queries = _unit_rows(queries, self._dim, "queries")
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        exclude = None
        if exclude_ids is not None:
            exclude = _as_ids(exclude_ids, "exclude_ids", non_negative=False)
            if len(exclude) != len(queries):
                raise ValueError(f"exclude_ids needs one id per query ({len(queries)}), got {len(exclude)}")
        return queries, int(k), exclude

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
        self, queries: npt.ArrayLike, k: int, *, exclude_ids: npt.ArrayLike | None = None
    ) -> SearchResult:
        """Top-k stored items by cosine similarity; ``exclude_ids[b]`` is never returned for query b."""
        queries, k, exclude = self._prepare(queries, k, exclude_ids)
        if self._keys is not None:
            similarities, ids, labels = self._keys.search(queries, k, exclude)
            return SearchResult(ids=ids, labels=labels, similarities=similarities)
        # One extra candidate per row makes up for the hit that leave-one-out may drop.
        width = k + (exclude is not None)
        similarities, ids = _select_top(*self._search_indexes(queries, width), k, exclude)
        return SearchResult(ids=ids, labels=self._lookup_labels(ids), similarities=similarities)

    def search_per_label(
        self, queries: npt.ArrayLike, k: int, num_labels: int, *, exclude_ids: npt.ArrayLike | None = None
    ) -> SearchResult:
        """For every label c < num_labels, the top-k items labelled c; arrays are (B, num_labels, k)."""
        queries, k, exclude = self._prepare(queries, k, exclude_ids)
        if int(num_labels) != num_labels or num_labels < 0:
            raise ValueError(f"num_labels must be a non-negative integer, got {num_labels!r}")
        num_labels = int(num_labels)
        if self._keys is not None:
            similarities, ids, labels = self._keys.search_per_label(queries, k, num_labels, exclude)
            return SearchResult(ids=ids, labels=labels, similarities=similarities)
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
        return SearchResult(ids=ids, labels=labels, similarities=similarities)

    def _label_search_params(self, num_labels: int) -> tuple[list[Any], np.ndarray]:
        """Per-label faiss search parameters restricting hits to that label, cached per store version."""
        key = (self.version, num_labels)
        if self._label_cache is not None and self._label_cache[0] == key:
            return self._label_cache[1], self._label_cache[3]
        # counts[c, i]: items labelled c in index i, so searches skip shards holding none of them.
        counts = np.zeros((num_labels, len(self._indexes)), dtype=np.int64)
        in_range = self._labels < num_labels
        np.add.at(counts, (self._labels[in_range], self._index_of[in_range]), 1)
        order = np.argsort(self._labels, kind="stable")
        bounds = np.searchsorted(self._labels[order], np.arange(num_labels + 1))
        params, selectors = [], []
        for label in range(num_labels):
            members = np.ascontiguousarray(self._ids[order[bounds[label] : bounds[label + 1]]])
            selector = faiss.IDSelectorBatch(len(members), faiss.swig_ptr(members))  # copies the ids
            if self._kind == "ivf":
                params.append(faiss.SearchParametersIVF(sel=selector, nprobe=self.nprobe))
            else:
                params.append(faiss.SearchParameters(sel=selector))
            selectors.append(selector)  # SearchParameters does not keep its selector alive by itself
        self._label_cache = (key, params, selectors, counts)
        return params, counts

    def export_state(self) -> StoreState:
        """The store's indexes and id arrays, for snapshots (``store_snapshot.py``); not copies.

        A torch-backed store exports new flat FAISS shards of its keys (as stored: fp16 on CUDA).
        """
        if self._keys is not None:
            flat = KnowledgeStore(self._dim, shard_size=self.shard_size)
            flat._ids, flat._labels, flat._texts = self._ids, self._labels, self._texts
            flat._build_flat(self._keys.vectors_of(self._ids))
            return flat.export_state()
        return StoreState(
            self._kind,
            self._indexes,
            self._ids,
            self._labels,
            self._index_of,
            self._ivf_built_at,
            self._texts,
        )

    def restore_state(self, state: StoreState) -> None:
        """Install what :meth:`export_state` returned (read back from a snapshot)."""
        if self._keys is not None:
            source = KnowledgeStore(self._dim)
            source.restore_state(state)
            self._keys = TorchKeys(self._dim, self.device)
            self._keys.add(state.ids, source._stored_vectors(), state.labels)
            self._ids, self._labels = state.ids, state.labels
            self._index_of = np.zeros(len(state.ids), dtype=np.int64)
            self._texts = dict(state.texts)
            return
        self._kind, self._indexes, self._ivf_built_at = state.kind, state.indexes, state.ivf_built_at
        self._ids, self._labels, self._index_of = state.ids, state.labels, state.index_of
        self._texts = dict(state.texts)
        self._label_cache = None
