"""KnowledgeStore: every fast path checked against a brute-force numpy reference on seeded data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from openbook.store import KnowledgeStore, SearchResult
from openbook.store_snapshot import read_snapshot, write_snapshot

DIM = 16  # the conftest stores' default dimension (`random_items`, `filled_store`)


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def brute_force(ids, vectors, queries, k, exclude=None):
    """Reference top-k by cosine: (ids, similarities) padded with -1 / -inf, plus the full matrix."""
    similarities = unit(np.asarray(queries, np.float64)) @ unit(np.asarray(vectors, np.float64)).T
    masked = similarities.copy()
    if exclude is not None:
        masked[ids[None, :] == np.asarray(exclude)[:, None]] = -np.inf
    order = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    top_ids, top_sims = ids[order], np.take_along_axis(masked, order, axis=1)
    top_ids[np.isinf(top_sims)] = -1
    pad = k - top_ids.shape[1]
    top_ids = np.pad(top_ids, ((0, 0), (0, pad)), constant_values=-1)
    top_sims = np.pad(top_sims, ((0, 0), (0, pad)), constant_values=-np.inf)
    return top_ids, top_sims, similarities


def assert_matches_reference(result_ids, result_sims, ref_ids, ref_sims, all_sims, stored_ids) -> None:
    """Same similarity profile as brute force, and every returned id really has its reported similarity.

    Comparing similarities rather than ids keeps the check valid when two items tie.
    """
    assert result_ids.dtype == np.int64 and result_sims.dtype == np.float32
    np.testing.assert_array_equal(result_ids == -1, ref_ids == -1)
    hit = result_ids >= 0
    np.testing.assert_allclose(result_sims[hit], ref_sims[hit], atol=1e-5)
    assert np.all(np.isneginf(result_sims[~hit]))
    columns = np.searchsorted(np.sort(stored_ids), result_ids)
    order = np.argsort(stored_ids)
    rows = np.broadcast_to(np.arange(len(result_ids))[:, None], result_ids.shape)
    true_sims = all_sims[rows[hit], order[columns[hit]]]
    np.testing.assert_allclose(result_sims[hit], true_sims, atol=1e-5)
    assert np.all(np.diff(np.where(hit, result_sims, -2.0), axis=-1) <= 1e-7), "not sorted descending"
    for row in result_ids.reshape(-1, result_ids.shape[-1]):
        assert len(set(row[row >= 0].tolist())) == (row >= 0).sum(), "duplicate hit in one row"


def test_ids_labels_and_vectors_after_adds(random_items):
    store = KnowledgeStore(DIM)
    first, second = random_items(50, seed=1), random_items(30, seed=2, first_id=10_000)
    store.add(*first)
    store.add(*second)
    all_ids = np.concatenate([first[0], second[0]])
    all_labels = np.concatenate([first[2], second[2]])
    assert len(store) == 80 and store.version == 2 and store.kind == "flat" and store.dim == DIM
    np.testing.assert_array_equal(store.ids(), np.sort(all_ids))
    np.testing.assert_array_equal(store.labels(), all_labels[np.argsort(all_ids)])
    np.testing.assert_array_equal(store.labels_of(second[0][::-1]), second[2][::-1])
    np.testing.assert_allclose(store.vectors_of(first[0][:5]), unit(first[1][:5]), atol=1e-6)
    np.testing.assert_array_equal(store.contains([first[0][0], -5, 10**12]), [True, False, False])
    with pytest.raises(KeyError, match="123456789"):
        store.labels_of([first[0][0], 123456789])
    with pytest.raises(KeyError):
        store.vectors_of([123456789])


@pytest.mark.parametrize("shard_size", [64, 16_384])
def test_search_matches_brute_force(shard_size, filled_store):
    store, (ids, vectors, _) = filled_store(500, seed=3, shard_size=shard_size)
    if shard_size == 64:
        assert store._keys.index_count == 8  # the merge across shards is what this case exercises
    queries = np.random.default_rng(4).standard_normal((20, DIM))
    result = store.search(queries, 10)
    ref_ids, ref_sims, all_sims = brute_force(ids, vectors, queries, 10)
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, ids)
    np.testing.assert_array_equal(result.labels, store.labels_of(result.ids.ravel()).reshape(20, 10))


def test_k_larger_than_len_is_padded(filled_store):
    store, (ids, vectors, _) = filled_store(7, seed=5, shard_size=3)
    queries = np.random.default_rng(6).standard_normal((4, DIM))
    result = store.search(queries, 12)
    assert result.ids.shape == result.labels.shape == result.similarities.shape == (4, 12)
    ref_ids, ref_sims, all_sims = brute_force(ids, vectors, queries, 12)
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, ids)
    assert np.all(result.ids[:, 7:] == -1) and np.all(result.labels[:, 7:] == -1)
    assert np.all(np.isneginf(result.similarities[:, 7:]))
    empty = KnowledgeStore(DIM).search(queries, 3)
    assert np.all(empty.ids == -1) and np.all(np.isneginf(empty.similarities))


def test_exclude_ids_is_leave_one_out(filled_store):
    store, (ids, vectors, _) = filled_store(200, seed=7, shard_size=50)
    picked = np.arange(0, 200, 10)
    plain = store.search(vectors[picked], 5)
    np.testing.assert_array_equal(plain.ids[:, 0], ids[picked])  # without exclusion, itself comes first
    result = store.search(vectors[picked], 5, exclude_ids=ids[picked])
    assert not np.any(result.ids == ids[picked][:, None])
    ref_ids, ref_sims, all_sims = brute_force(ids, vectors, vectors[picked], 5, exclude=ids[picked])
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, ids)
    # Excluding an id that isn't stored changes nothing.
    unchanged = store.search(vectors[picked], 5, exclude_ids=np.full(len(picked), 999_999_999))
    np.testing.assert_array_equal(unchanged.ids, plain.ids)


def test_upsert_replaces_vector_and_label(filled_store):
    store, (ids, vectors, labels) = filled_store(100, seed=8, shard_size=32)
    target = ids[10]
    new_vector = np.random.default_rng(9).standard_normal((1, DIM))
    store.add([target], new_vector, [labels[10] + 7])
    assert len(store) == 100
    assert store.labels_of([target])[0] == labels[10] + 7
    np.testing.assert_allclose(store.vectors_of([target]), unit(new_vector), atol=1e-6)
    result = store.search(new_vector, 100)
    assert result.ids[0, 0] == target and result.labels[0, 0] == labels[10] + 7
    assert (result.ids == target).sum() == 1 and len(np.unique(result.ids)) == 100
    updated = vectors.copy()
    updated[10] = new_vector[0]
    ref_ids, ref_sims, all_sims = brute_force(ids, updated, new_vector, 100)
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, ids)


def test_duplicate_ids_within_a_batch_last_wins():
    store = KnowledgeStore(DIM)
    vectors = np.random.default_rng(10).standard_normal((4, DIM))
    store.add([5, 9, 5, 5], vectors, [1, 2, 3, 4])
    assert len(store) == 2
    np.testing.assert_array_equal(store.ids(), [5, 9])
    np.testing.assert_array_equal(store.labels(), [4, 2])
    np.testing.assert_allclose(store.vectors_of([5]), unit(vectors[3:4]), atol=1e-6)


def test_remove_drops_items_and_ignores_unknown_ids(filled_store):
    store, (ids, vectors, labels) = filled_store(120, seed=11, shard_size=16)
    gone = ids[:40]  # spans several shards, including emptying some completely
    version = store.version
    assert store.remove(np.concatenate([gone, [-3, 10**9], gone[:2]])) == 40
    assert store.version == version + 1 and len(store) == 80
    assert store.remove([10**9]) == 0 and store.version == version + 1
    assert not store.contains(gone).any() and store.contains(ids[40:]).all()
    np.testing.assert_array_equal(store.labels_of(ids[40:]), labels[40:])
    queries = vectors[:40]  # the removed vectors themselves are the hardest queries
    result = store.search(queries, 80)
    assert not np.isin(result.ids, gone).any()
    ref_ids, ref_sims, all_sims = brute_force(ids[40:], vectors[40:], queries, 80)
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, ids[40:])
    store.add(ids[:5], vectors[:5], labels[:5])  # re-adding after a remove works
    assert len(store) == 85 and store.search(vectors[:1], 1).ids[0, 0] == ids[0]


@pytest.mark.parametrize("exclude", [False, True])
def test_search_per_label_matches_brute_force(exclude, filled_store):
    store, (ids, vectors, labels) = filled_store(300, seed=12, shard_size=64)
    num_labels = 6  # labels 4 and 5 have no items
    queries = vectors[:15] if exclude else np.random.default_rng(13).standard_normal((15, DIM))
    exclude_ids = ids[:15] if exclude else None
    result = store.search_per_label(queries, 4, num_labels, exclude_ids=exclude_ids)
    assert isinstance(result, SearchResult) and result.ids.shape == (15, num_labels, 4)
    for label in range(num_labels):
        members = labels == label
        ref_ids, ref_sims, all_sims = brute_force(ids[members], vectors[members], queries, 4, exclude_ids)
        assert_matches_reference(
            result.ids[:, label], result.similarities[:, label], ref_ids, ref_sims, all_sims, ids[members]
        )
        expected_labels = np.where(result.ids[:, label] >= 0, label, -1)
        np.testing.assert_array_equal(result.labels[:, label], expected_labels)
    assert np.all(result.ids[:, 4:] == -1)
    # The cached selectors must follow mutations: move one item to label 5 and it shows up there.
    store.add(ids[20:21], vectors[20:21], [5])
    moved = store.search_per_label(vectors[20:21], 1, num_labels)
    assert moved.ids[0, 5, 0] == ids[20] and ids[20] not in moved.ids[0, :5]


def _bad_inputs(a: int, b: int) -> dict[str, tuple]:
    """Invalid add() arguments built around the stored ids a and b, so a half-applied upsert would show."""
    good_vectors = np.ones((2, DIM))
    return {
        "ids not 1-D": ([[a, b]], good_vectors, [0, 1]),
        "ids float non-integral": ([a + 0.5, b], good_vectors, [0, 1]),
        "ids strings": ([str(a), str(b)], good_vectors, [0, 1]),
        "negative id": ([a, -2], good_vectors, [0, 1]),
        "wrong dim": ([a, b], np.ones((2, DIM + 1)), [0, 1]),
        "vectors 1-D": ([a], np.ones(DIM), [0]),
        "vectors not numeric": ([a, b], [["x"] * DIM] * 2, [0, 1]),
        "N mismatch vectors": ([a, b], np.ones((3, DIM)), [0, 1]),
        "N mismatch labels": ([a, b], good_vectors, [0]),
        "nan": ([a, b], np.full((2, DIM), np.nan), [0, 1]),
        "inf": ([a, b], np.where(np.eye(2, DIM) > 0, np.inf, 1.0), [0, 1]),
        "zero vector": ([a, b], np.vstack([np.ones(DIM), np.zeros(DIM)]), [0, 1]),
        "negative label": ([a, b], good_vectors, [0, -1]),
        "id beyond int64": (np.array([a, 2**63], dtype=np.uint64), good_vectors, [0, 1]),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(0, 1)))
def test_invalid_add_raises_and_leaves_store_unchanged(case, filled_store):
    store, (ids, vectors, labels) = filled_store(50, seed=14)
    before = store.search(vectors[:5], 5)
    version = store.version
    with pytest.raises(ValueError):
        store.add(*_bad_inputs(int(ids[0]), int(ids[1]))[case])
    assert len(store) == 50 and store.version == version
    after = store.search(vectors[:5], 5)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_array_equal(after.similarities, before.similarities)
    np.testing.assert_array_equal(store.labels_of(ids[:2]), labels[:2])
    np.testing.assert_allclose(store.vectors_of(ids[:2]), unit(vectors[:2]), atol=1e-6)


def test_invalid_search_arguments_raise(filled_store):
    store, (ids, vectors, _) = filled_store(20, seed=15)
    for bad_call in (
        lambda: store.search(np.ones((2, DIM + 1)), 3),
        lambda: store.search(np.zeros((1, DIM)), 3),
        lambda: store.search(vectors[:2], 0),
        lambda: store.search(vectors[:2], 3, exclude_ids=ids[:3]),
        lambda: store.search_per_label(vectors[:2], 3, -1),
    ):
        with pytest.raises(ValueError):
            bad_call()


def clustered(count: int, dim: int, seed: int, num_clusters: int = 20):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_clusters, dim))
    assignment = rng.integers(0, num_clusters, count)
    vectors = centres[assignment] + 0.3 * rng.standard_normal((count, dim))
    return np.arange(count, dtype=np.int64) * 3 + 1, vectors.astype(np.float32), assignment % 5


def test_approximate_index_measures_recall_and_supports_mutation(tmp_path: Path):
    ids, vectors, labels = clustered(2400, 32, seed=20)
    store = KnowledgeStore(32, approx_threshold=2000, nprobe=8, seed=0)
    store.add(ids[:1500], vectors[:1500], labels[:1500])
    assert store.kind == "flat" and store.approx_recall is None
    store.add(ids[1500:2000], vectors[1500:2000], labels[1500:2000])
    assert store.kind == "ivf" and len(store) == 2000
    assert store.approx_recall is not None and store.approx_recall >= 0.9
    queries = unit(vectors[:100].astype(np.float64))
    # The index's own recall against brute force, measured independently of approx_recall.
    result = store.search(queries, 10)
    ref_ids, _, _ = brute_force(ids[:2000], vectors[:2000], queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(result.ids, ref_ids, strict=True)])
    assert recall >= 0.9
    # Upsert, add and remove still behave on the IVF index.
    store.add(ids[:3], vectors[2000:2003], [4, 4, 4])
    store.add(ids[2000:2100], vectors[2000:2100], labels[2000:2100])
    assert store.remove(ids[100:200]) == 100 and len(store) == 2000 and store.kind == "ivf"
    np.testing.assert_array_equal(store.labels_of(ids[:3]), [4, 4, 4])
    np.testing.assert_allclose(store.vectors_of(ids[:3]), unit(vectors[2000:2003]), atol=1e-6)
    hits = store.search(vectors[100:200], 20).ids
    assert not np.isin(hits, ids[100:200]).any()
    assert (store.search(vectors[:3], 1000).ids == ids[0]).sum() <= 1
    loo = store.search(vectors[2000:2050], 5, exclude_ids=ids[2000:2050])
    assert not np.any(loo.ids == ids[2000:2050, None])
    per_label = store.search_per_label(vectors[300:310], 3, 5)
    stored_label = store.labels_of(per_label.ids[per_label.ids >= 0])
    np.testing.assert_array_equal(stored_label, per_label.labels[per_label.ids >= 0])
    # The snapshot keeps the IVF index, its recall and its exact answers.
    write_snapshot(store, tmp_path / "ivf")
    loaded = read_snapshot(tmp_path / "ivf")
    assert loaded.kind == "ivf" and loaded.approx_recall == store.approx_recall
    np.testing.assert_array_equal(loaded.search(queries, 10).ids, store.search(queries, 10).ids)
    # Shrinking below half the threshold goes back to exact search, which then matches brute force.
    keep = store.ids()[:900]
    store.remove(np.setdiff1d(store.ids(), keep))
    assert store.kind == "flat" and store.approx_recall is None and len(store) == 900
    result = store.search(queries, 5)
    kept_vectors = store.vectors_of(keep)
    ref_ids, ref_sims, all_sims = brute_force(keep, kept_vectors, queries, 5)
    assert_matches_reference(result.ids, result.similarities, ref_ids, ref_sims, all_sims, keep)


def test_approx_recall_reports_what_the_index_really_achieves():
    # Unclustered data with a single probed list: a setting where IVF recall is clearly below 1.
    rng = np.random.default_rng(21)
    ids, vectors = np.arange(2000, dtype=np.int64), rng.standard_normal((2000, 32)).astype(np.float32)
    store = KnowledgeStore(32, approx_threshold=2000, nprobe=1, seed=0)
    store.add(ids, vectors, np.zeros(2000, dtype=np.int64))
    assert store.kind == "ivf"
    ref_ids, _, _ = brute_force(ids, vectors, vectors, 10)
    found = store.search(vectors, 10).ids
    measured = np.mean((found[:, :, None] == ref_ids[:, None, :]).any(axis=2))
    assert measured < 0.9
    assert store.approx_recall == pytest.approx(measured, abs=0.05)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_texts_follow_their_entries(backend):
    store = KnowledgeStore(DIM, backend=backend, shard_size=2)
    vectors = np.random.default_rng(13).standard_normal((4, DIM))
    store.add([1, 2, 3], vectors[:3], [0, 1, 0], texts=["one", ("two a", "two b"), "three"])
    assert store.texts_of([3, 1, 2]) == ["three", "one", ("two a", "two b")]
    store.add([1, 1], vectors[2:4], [1, 1], texts=["stale", "new one"])  # upsert: the last occurrence wins
    assert store.texts_of([1]) == ["new one"]
    store.add([3], vectors[:1], [0])  # replaced without a text: the old one does not linger
    with pytest.raises(KeyError, match="id 3 is stored without its text"):
        store.texts_of([3])
    store.remove([2])
    with pytest.raises(KeyError, match="id 2 is not in the store"):
        store.texts_of([2])
    moved = store.to("cpu", backend="torch" if backend == "faiss" else "faiss")
    assert moved.texts_of([1]) == ["new one"] and moved.backend != store.backend
    with pytest.raises(ValueError, match="texts must have the same length"):
        store.add([4, 5], vectors[:2], [0, 0], texts=["only one"])


def _mean_of_stored(store: KnowledgeStore) -> np.ndarray:
    """Brute force: the mean of every stored key, read back one by one."""
    ids = store.ids()
    return np.mean([store.vectors_of([i])[0] for i in ids], axis=0) if len(ids) else np.zeros(store.dim)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_key_mean_follows_adds_upserts_and_removals(backend, random_items):
    store = KnowledgeStore(DIM, backend=backend, shard_size=16)
    np.testing.assert_array_equal(store.key_mean(), np.zeros(DIM))  # empty
    ids, vectors, labels = random_items(60, seed=31)
    store.add(ids[:40], vectors[:40], labels[:40])
    np.testing.assert_allclose(store.key_mean(), _mean_of_stored(store), atol=1e-7)  # summed once
    store.add(ids[30:], -vectors[30:], labels[30:])  # 10 replaced, 20 new
    np.testing.assert_allclose(store.key_mean(), _mean_of_stored(store), atol=1e-7)
    store.remove(ids[::3])
    np.testing.assert_allclose(store.key_mean(), _mean_of_stored(store), atol=1e-7)
    moved = store.to("cpu", backend="torch" if backend == "faiss" else "faiss")
    np.testing.assert_allclose(moved.key_mean(), store.key_mean(), atol=1e-7)
    store.remove(store.ids())
    np.testing.assert_array_equal(store.key_mean(), np.zeros(DIM))
    store.add(ids[:2], vectors[:2], labels[:2])  # after emptying, the sum starts again from these two
    np.testing.assert_allclose(store.key_mean(), _mean_of_stored(store), atol=1e-7)


def test_key_mean_survives_a_snapshot_and_the_approximate_index(tmp_path: Path, random_items):
    store = KnowledgeStore(DIM, approx_threshold=400, nprobe=4)
    ids, vectors, labels = random_items(500, seed=32)
    store.add(ids, vectors, labels)
    assert store.kind == "ivf"
    before = store.key_mean()
    store.remove(ids[:50])
    store.add(ids[50:80], vectors[:30], labels[:30])  # replaced inside the IVF index
    np.testing.assert_allclose(store.key_mean(), _mean_of_stored(store), atol=1e-7)
    assert not np.allclose(store.key_mean(), before)
    write_snapshot(store, tmp_path / "snapshot")
    restored = read_snapshot(tmp_path / "snapshot")
    np.testing.assert_allclose(restored.key_mean(), store.key_mean(), atol=1e-7)
