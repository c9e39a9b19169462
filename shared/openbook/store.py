"""The knowledge store: L2-normalised "slot vectors", each with a stable id, a class label and maybe its text.

The text is what textual demonstrations (`demonstrations.py`) write into a prompt; it travels with the
entry (an upsert without a text leaves the entry without one, a removal drops it) and with snapshots.

Similarity is the inner product of unit vectors, i.e. cosine similarity. This class validates what comes
in, keeps the ids, labels and texts, and leaves the keys to one of two backends with one interface:

- `store_faiss.FaissKeys` on the CPU: exact search over flat shards while small; once the store reaches
  ``approx_threshold`` items, an IVF index whose recall@10 is measured and kept (``approx_recall``);
- `store_torch.TorchKeys` on a CUDA device: the keys on the GPU, exact search at every size, one matrix
  product per batch.

Snapshots (`store_snapshot.py`) are written in the FAISS format either way (`to` converts).

The mean of the stored keys (`key_mean`, what a centred kNN subtracts, `knn.py`) is summed over the keys
the first time it is asked for, then kept up to date by every add and removal; a snapshot does not hold
it, since it follows from the keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from openbook.prompting.templates import TextInput
from openbook.store_faiss import DEFAULT_SHARD_SIZE, FaissKeys, StoreState, flat_state
from openbook.store_torch import TorchKeys

__all__ = ["DEFAULT_SHARD_SIZE", "Backend", "KnowledgeStore", "SearchResult", "StoreState"]

Backend = Literal["auto", "faiss", "torch"]  # auto: torch on a CUDA device, faiss on the CPU
SUM_CHUNK = 65_536  # keys read back at a time while summing them (150 MB at dim 576)


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
        self.version = 0
        self._texts: dict[int, TextInput] = {}
        self.device = torch.device(device)
        if backend == "auto":
            backend = "torch" if self.device.type == "cuda" else "faiss"
        if backend not in ("faiss", "torch") or (backend == "faiss" and self.device.type != "cpu"):
            raise ValueError(f"backend {backend!r} cannot run on {self.device} (faiss: cpu; torch: any)")
        self.backend: Backend = backend
        self._keys: FaissKeys | TorchKeys = self._new_keys()
        self._key_sum: np.ndarray | None = None  # (dim,) float64 sum of the keys, kept once asked for

    def _new_keys(self) -> FaissKeys | TorchKeys:
        if self.backend == "torch":
            return TorchKeys(self._dim, self.device)
        return FaissKeys(
            self._dim,
            approx_threshold=self.approx_threshold,
            nprobe=self.nprobe,
            seed=self.seed,
            shard_size=self.shard_size,
        )

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
        moved.version, moved.metadata = self.version, dict(self.metadata)
        return moved

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def key_dtype(self) -> str:
        """What the keys are searched in: float16 on CUDA (torch backend), else float32."""
        if isinstance(self._keys, TorchKeys):
            return str(self._keys.dtype).removeprefix("torch.")
        return "float32"

    @property
    def kind(self) -> str:
        """ "flat" or "ivf" (FAISS); the torch backend's exact search is "flat", as its snapshots are."""
        return self._keys.kind if isinstance(self._keys, FaissKeys) else "flat"

    @property
    def approx_recall(self) -> float | None:
        """The IVF index's recall@10 against exact search, measured when it was built; None when exact."""
        return self._keys.approx_recall if isinstance(self._keys, FaissKeys) else None

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self) -> np.ndarray:
        """The stored ids, sorted."""
        return self._keys.sorted_ids().copy()

    def labels(self) -> np.ndarray:
        """The label of each id, in the order of :meth:`ids`."""
        return self._keys.labels_of(self._keys.sorted_ids())

    def contains(self, ids: npt.ArrayLike) -> np.ndarray:
        return self._keys.contains(_as_ids(ids, "ids", non_negative=False))

    def _check_stored(self, ids: np.ndarray) -> None:
        found = self._keys.contains(ids)
        if not found.all():
            raise KeyError(f"id {int(ids[~found][0])} is not in the store")

    def labels_of(self, ids: npt.ArrayLike) -> np.ndarray:
        ids = _as_ids(ids, "ids", non_negative=False)
        self._check_stored(ids)
        return self._keys.labels_of(ids)

    def vectors_of(self, ids: npt.ArrayLike) -> np.ndarray:
        ids = _as_ids(ids, "ids", non_negative=False)
        self._check_stored(ids)
        return self._keys.vectors_of(ids)

    def key_mean(self) -> np.ndarray:
        """(dim,) float64 mean of the stored keys, as stored (fp16-rounded on CUDA); zeros when empty."""
        if self._key_sum is None:
            self._key_sum = self._sum_of(self._keys.sorted_ids())
        return self._key_sum / max(len(self), 1)

    def _sum_of(self, ids: np.ndarray) -> np.ndarray:
        """(dim,) float64 sum of the stored keys of `ids` (every one stored)."""
        total = np.zeros(self._dim, dtype=np.float64)
        for start in range(0, len(ids), SUM_CHUNK):
            total += self._keys.vectors_of(ids[start : start + SUM_CHUNK]).sum(axis=0, dtype=np.float64)
        return total

    def texts_of(self, ids: npt.ArrayLike) -> list[TextInput]:
        """The stored texts of `ids`; KeyError for an id not stored, or stored without its text."""
        ids = _as_ids(ids, "ids", non_negative=False)
        self._check_stored(ids)
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
        ids, vectors, labels = ids[keep], vectors[keep], labels[keep]  # sorted, unique
        replaced = ids[self._keys.contains(ids)]
        if self._texts:
            for dropped in replaced.tolist():
                self._texts.pop(dropped, None)
        if self._key_sum is not None:
            self._key_sum -= self._sum_of(replaced)
        self._keys.add(ids, vectors, labels)
        if self._key_sum is not None:
            self._key_sum += self._sum_of(ids)  # as stored, so that removing them later cancels exactly
        if texts is not None:
            self._texts.update(zip(ids.tolist(), [texts[i] for i in keep], strict=True))
        self.version += 1

    def remove(self, ids: npt.ArrayLike) -> int:
        """Remove the given ids; unknown ids are ignored. Returns how many were actually removed."""
        ids = np.unique(_as_ids(ids, "ids", non_negative=False))
        present = ids[self._keys.contains(ids)]
        if len(present) == 0:
            return 0
        if self._key_sum is not None:
            self._key_sum -= self._sum_of(present)
        self._keys.remove(present)
        if len(self._keys) == 0:
            self._key_sum = None  # the next sum starts from nothing, not from rounding left over
        for dropped in present.tolist():
            self._texts.pop(dropped, None)
        self.version += 1
        return len(present)

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

    def search(
        self, queries: npt.ArrayLike, k: int, *, exclude_ids: npt.ArrayLike | None = None
    ) -> SearchResult:
        """Top-k stored items by cosine similarity; ``exclude_ids[b]`` is never returned for query b."""
        queries, k, exclude = self._prepare(queries, k, exclude_ids)
        similarities, ids, labels = self._keys.search(queries, k, exclude)
        return SearchResult(ids=ids, labels=labels, similarities=similarities)

    def search_per_label(
        self, queries: npt.ArrayLike, k: int, num_labels: int, *, exclude_ids: npt.ArrayLike | None = None
    ) -> SearchResult:
        """For every label c < num_labels, the top-k items labelled c; arrays are (B, num_labels, k)."""
        queries, k, exclude = self._prepare(queries, k, exclude_ids)
        if int(num_labels) != num_labels or num_labels < 0:
            raise ValueError(f"num_labels must be a non-negative integer, got {num_labels!r}")
        similarities, ids, labels = self._keys.search_per_label(queries, k, int(num_labels), exclude)
        return SearchResult(ids=ids, labels=labels, similarities=similarities)

    def export_state(self) -> StoreState:
        """The store's indexes, id arrays and texts, for snapshots (``store_snapshot.py``); not copies.

        A torch-backed store exports new flat FAISS shards of its keys (as stored: fp16 on CUDA).
        """
        if isinstance(self._keys, TorchKeys):
            ids = self._keys.sorted_ids()
            state = flat_state(self._dim, self.shard_size, ids, self._keys.vectors_of(ids), self.labels())
        else:
            state = self._keys.export_state()
        return dataclasses.replace(state, texts=self._texts)

    def restore_state(self, state: StoreState) -> None:
        """Install what :meth:`export_state` returned (read back from a snapshot)."""
        if self.backend == "torch":
            source = FaissKeys(self._dim, approx_threshold=self.approx_threshold, nprobe=1, seed=self.seed)
            source.restore_state(state)
            self._keys = TorchKeys(self._dim, self.device)
            self._keys.add(state.ids, source.vectors_of(state.ids), state.labels)
        else:
            self._keys = self._new_keys()
            assert isinstance(self._keys, FaissKeys)  # the faiss backend's keys
            self._keys.restore_state(state)
        self._texts = dict(state.texts)
        self._key_sum = None
