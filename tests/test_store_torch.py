"""The torch kNN backend against a brute-force numpy reference on seeded data, and against FAISS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.store import KnowledgeStore
from openbook.store_snapshot import read_snapshot, write_snapshot
from openbook.store_torch import TorchKeys

DIM = 16
NUM_LABELS = 3
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def unit(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


class Reference:
    """What the store should hold: a dict of id -> (vector, label), searched by brute force in float64."""

    def __init__(self) -> None:
        self.items: dict[int, tuple[np.ndarray, int]] = {}

    def add(self, ids, vectors, labels) -> None:
        for i, v, label in zip(ids, vectors, labels, strict=True):
            self.items[int(i)] = (v, int(label))

    def remove(self, ids) -> None:
        for i in ids:
            self.items.pop(int(i), None)

    def search(self, queries, k, exclude=None, label=None):
        """(ids, similarities) (B, k) and the full similarity rows, padded with -1 / -inf."""
        ids = np.array(sorted(self.items), dtype=np.int64)
        if label is not None:
            ids = ids[[self.items[int(i)][1] == label for i in ids]]
        vectors = np.array([self.items[int(i)][0] for i in ids], np.float64).reshape(len(ids), DIM)
        scores = np.asarray(queries, np.float64) @ vectors.T  # (B, N)
        if exclude is not None:
            scores[ids[None, :] == np.asarray(exclude)[:, None]] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(scores, order, axis=1)
        top_ids = np.where(np.isinf(top), -1, ids[order] if len(ids) else -1)
        pad = k - top.shape[1]
        return (
            np.pad(top_ids, ((0, 0), (0, pad)), constant_values=-1),
            np.pad(top, ((0, 0), (0, pad)), constant_values=-np.inf),
        )


def assert_same_hits(similarities, ids, labels, reference: Reference, ref_ids, ref_sims, atol) -> None:
    """Same similarity profile as brute force; each returned id really has that similarity and label.

    Similarities are compared rather than ids, so a tie may come back in either order.
    """
    assert ids.dtype == labels.dtype == np.int64 and similarities.dtype == np.float32
    np.testing.assert_array_equal(ids == -1, ref_ids == -1)
    hit = ids >= 0
    np.testing.assert_allclose(similarities[hit], ref_sims[hit], atol=atol)
    assert np.isneginf(similarities[~hit]).all() and (labels[~hit] == -1).all()
    for i, label in zip(ids[hit], labels[hit], strict=True):
        assert reference.items[int(i)][1] == label
    rows_are_unique = [len(set(row[row >= 0])) == (row >= 0).sum() for row in ids.reshape(-1, ids.shape[-1])]
    assert all(rows_are_unique)


def churned(seed: int, keys: TorchKeys) -> Reference:
    """Random adds, upserts of stored ids (new vector and label) and removals, mirrored in a Reference."""
    rng = np.random.default_rng(seed)
    reference = Reference()
    pool = rng.permutation(1000)[:120].astype(np.int64) * 3  # spread-out ids, not in insertion order
    for step in range(12):
        ids = rng.choice(pool, size=int(rng.integers(1, 25)), replace=False)
        vectors = unit(rng.standard_normal((len(ids), DIM)))
        labels = rng.integers(0, NUM_LABELS + 1, len(ids))  # label NUM_LABELS: outside per-label searches
        keys.add(ids, vectors, labels)
        reference.add(ids, vectors, labels)
        if step % 3 == 2:
            stored = np.array(sorted(reference.items), dtype=np.int64)
            gone = np.concatenate([rng.choice(stored, size=len(stored) // 4, replace=False), [10**9]])
            keys.remove(gone)  # an unknown id is ignored
            reference.remove(gone)
    return reference


@pytest.mark.parametrize("max_scores", [1 << 25, 7 * 5])  # one chunk; chunks of 7 keys for 5 queries
@pytest.mark.parametrize("k", [1, 4, 500])
def test_search_matches_brute_force_after_churn(max_scores: int, k: int):
    keys = TorchKeys(DIM, "cpu", max_scores=max_scores)
    reference = churned(0, keys)
    assert len(keys) == len(reference.items)
    queries = unit(np.random.default_rng(1).standard_normal((5, DIM)))
    stored = np.array(sorted(reference.items))
    for exclude in (None, np.array([stored[0], stored[3], -1, 10**9, stored[-1]])):
        similarities, ids, labels = keys.search(queries, k, exclude)
        assert ids.shape == (5, k)
        ref_ids, ref_sims = reference.search(queries, k, exclude)
        assert_same_hits(similarities, ids, labels, reference, ref_ids, ref_sims, atol=1e-5)
        if exclude is not None:
            assert not ((ids == exclude[:, None]) & (ids >= 0)).any()


@pytest.mark.parametrize("max_scores", [1 << 25, 11])
def test_per_label_search_matches_brute_force(max_scores: int):
    keys = TorchKeys(DIM, "cpu", max_scores=max_scores)
    reference = churned(2, keys)
    queries = unit(np.random.default_rng(3).standard_normal((4, DIM)))
    stored = np.array(sorted(reference.items))
    exclude = stored[[5, 6, 7, 8]]
    k = 40  # more than some labels hold
    similarities, ids, labels = keys.search_per_label(queries, k, NUM_LABELS + 1, exclude)
    assert ids.shape == (4, NUM_LABELS + 1, k)
    for label in range(NUM_LABELS + 1):
        ref_ids, ref_sims = reference.search(queries, k, exclude, label=label)
        got = similarities[:, label], ids[:, label], labels[:, label]
        assert_same_hits(*got, reference, ref_ids, ref_sims, atol=1e-5)
        assert ((labels[:, label] == label) | (ids[:, label] == -1)).all()
    # labels at or past num_labels are never returned; a label nobody has gives only missing hits
    narrow = keys.search_per_label(queries, k, NUM_LABELS, exclude)[2]
    assert narrow.shape == (4, NUM_LABELS, k) and (narrow < NUM_LABELS).all()
    empty = TorchKeys(DIM, "cpu")
    empty.add(np.array([1]), queries[:1], np.array([0]))
    _, none_ids, _ = empty.search_per_label(queries, 3, 2)
    assert (none_ids[:, 1] == -1).all() and (none_ids[:, 0, 1:] == -1).all()


def test_ties_return_every_tied_id_and_vectors_round_trip():
    rng = np.random.default_rng(4)
    base = unit(rng.standard_normal((1, DIM)))
    keys = TorchKeys(DIM, "cpu", max_scores=3)  # ties split across chunks
    keys.add(np.array([5, 9, 2]), np.repeat(base, 3, axis=0), np.array([0, 1, 0]))
    keys.add(np.array([7]), unit(rng.standard_normal((1, DIM))), np.array([1]))
    similarities, ids, _ = keys.search(base, 3)
    assert set(ids[0].tolist()) == {5, 9, 2}
    np.testing.assert_allclose(similarities[0], 1.0, atol=1e-6)
    np.testing.assert_array_equal(keys.vectors_of(np.array([9, 7])[:1]), base)
    with pytest.raises(KeyError):
        keys.vectors_of(np.array([3]))


def test_an_emptied_store_finds_nothing_and_refills():
    keys = TorchKeys(DIM, "cpu")
    queries = unit(np.random.default_rng(5).standard_normal((2, DIM)))
    assert (keys.search(queries, 3)[1] == -1).all()
    keys.add(np.array([1, 2]), queries, np.array([0, 1]))
    keys.remove(np.array([2, 1]))
    similarities, ids, labels = keys.search(queries, 3)
    assert (ids == -1).all() and (labels == -1).all() and np.isneginf(similarities).all()
    keys.add(np.array([4]), queries[1:], np.array([1]))
    assert keys.search(queries, 1)[1].tolist() == [[4], [4]]


def test_float16_keys_stay_within_their_precision():
    """fp16 keys (the CUDA default, run here on the CPU): similarities within 2e-3, near-ties may swap."""
    keys = TorchKeys(DIM, "cpu", dtype=torch.float16)
    reference = churned(6, keys)
    queries = unit(np.random.default_rng(7).standard_normal((6, DIM)))
    similarities, ids, _ = keys.search(queries, 8)
    _, ref_sims = reference.search(queries, 8)
    np.testing.assert_allclose(similarities, ref_sims, atol=2e-3)
    exact = np.array([[queries[b] @ reference.items[int(i)][0] for i in row] for b, row in enumerate(ids)])
    np.testing.assert_allclose(exact, ref_sims, atol=4e-3)  # what came back is as good as the best


def filled_pair(seed: int = 8, **options) -> tuple[KnowledgeStore, KnowledgeStore]:
    """The same random adds, upserts and removals applied to a FAISS store and a torch store."""
    rng = np.random.default_rng(seed)
    stores = KnowledgeStore(DIM, **options), KnowledgeStore(DIM, backend="torch", **options)
    for _ in range(4):
        ids = rng.choice(400, size=120, replace=False)
        vectors = rng.standard_normal((120, DIM))  # not unit: the store normalises
        labels = rng.integers(0, NUM_LABELS, 120)
        gone = rng.choice(400, size=30, replace=False)
        for store in stores:
            store.add(ids, vectors, labels)
            store.remove(gone)
    return stores


def assert_same_results(a, b, atol=1e-5) -> None:
    np.testing.assert_array_equal(a.ids, b.ids)  # random data: no ties
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(a.similarities, b.similarities, atol=atol)


def test_the_torch_backend_gives_the_faiss_results():
    faiss_store, torch_store = filled_pair()
    assert (faiss_store.backend, torch_store.backend) == ("faiss", "torch")
    np.testing.assert_array_equal(faiss_store.ids(), torch_store.ids())
    queries = np.random.default_rng(9).standard_normal((7, DIM))
    exclude = faiss_store.ids()[:7]
    for k in (1, 10, 1000):
        assert_same_results(faiss_store.search(queries, k), torch_store.search(queries, k))
        assert_same_results(
            faiss_store.search(queries, k, exclude_ids=exclude),
            torch_store.search(queries, k, exclude_ids=exclude),
        )
        assert_same_results(
            faiss_store.search_per_label(queries, k, NUM_LABELS, exclude_ids=exclude),
            torch_store.search_per_label(queries, k, NUM_LABELS, exclude_ids=exclude),
        )
    ids = faiss_store.ids()[::5]
    np.testing.assert_allclose(faiss_store.vectors_of(ids), torch_store.vectors_of(ids), atol=1e-7)
    np.testing.assert_array_equal(faiss_store.labels_of(ids), torch_store.labels_of(ids))


def test_the_torch_backend_stays_exact_where_faiss_goes_approximate():
    faiss_store, torch_store = filled_pair(approx_threshold=50)
    assert (faiss_store.kind, torch_store.kind) == ("ivf", "flat")
    queries = np.random.default_rng(10).standard_normal((3, DIM))
    exact = KnowledgeStore(DIM, approx_threshold=10**6)
    exact.add(torch_store.ids(), torch_store.vectors_of(torch_store.ids()), torch_store.labels())
    assert_same_results(exact.search(queries, 10), torch_store.search(queries, 10))


def test_snapshots_and_moves_keep_the_results(tmp_path: Path):
    faiss_store, torch_store = filled_pair(shard_size=64)
    torch_store.metadata = {"task": "x"}
    queries = np.random.default_rng(11).standard_normal((4, DIM))
    expected = faiss_store.search(queries, 12)
    write_snapshot(torch_store, tmp_path / "snap")  # the FAISS format: flat shards of shard_size
    restored = read_snapshot(tmp_path / "snap")
    assert restored.backend == "faiss" and restored.version == torch_store.version
    assert restored.metadata == {"task": "x"} and len(restored.export_state().indexes) > 1
    assert_same_results(expected, restored.search(queries, 12))
    back = restored.to("cpu", backend="torch")
    assert back.backend == "torch" and back.version == restored.version
    assert_same_results(expected, back.search(queries, 12))
    assert back.to("cpu", backend="torch") is back  # nothing to move
    back.add([10**6], queries[:1], [1])  # still a working store after the move
    assert back.search(queries[:1], 1).ids[0, 0] == 10**6


def test_the_backend_follows_the_device():
    assert KnowledgeStore(DIM).backend == "faiss"
    assert KnowledgeStore(DIM, backend="torch").device == torch.device("cpu")
    with pytest.raises(ValueError, match="cannot run on"):
        KnowledgeStore(DIM, device="cuda", backend="faiss")


def test_a_classifier_keeps_its_store_on_the_backbone_device(causal_backbone, toy):
    from openbook.classifier import Classifier

    TEMPLATE, VERBALIZER = toy.template, toy.verbalizer
    classifier = Classifier(causal_backbone, TEMPLATE, VERBALIZER)
    assert classifier.store.device == causal_backbone.device and classifier.store.backend == "faiss"
    on_cpu_torch = KnowledgeStore(causal_backbone.hidden_size, backend="torch")
    assert Classifier(causal_backbone, TEMPLATE, VERBALIZER, store=on_cpu_torch).store is on_cpu_torch


@needs_cuda
def test_on_cuda_the_store_searches_fp16_keys_on_the_device():
    faiss_store, _ = filled_pair()
    on_gpu = faiss_store.to("cuda")
    assert on_gpu.backend == "torch" and on_gpu._keys is not None and on_gpu._keys.dtype == torch.float16
    queries = np.random.default_rng(12).standard_normal((5, DIM))
    expected, got = faiss_store.search(queries, 10), on_gpu.search(queries, 10)
    np.testing.assert_allclose(got.similarities, expected.similarities, atol=2e-3)
    exclude = faiss_store.ids()[:5]
    per_label = on_gpu.search_per_label(queries, 4, NUM_LABELS, exclude_ids=exclude)
    assert not (per_label.ids == exclude[:, None, None]).any()
    back = on_gpu.to("cpu")
    assert back.backend == "faiss"
    np.testing.assert_allclose(back.search(queries, 10).similarities, expected.similarities, atol=2e-3)
