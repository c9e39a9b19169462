"""kNN scoring (`knn.py`): each path against a brute-force reference on seeded synthetic data."""

import numpy as np
import pytest
import torch
from openbook.knn import (
    RERANK_WIDTH,
    KnnConfig,
    centred_cosine,
    interpolate,
    knn_distribution,
    knn_mixture,
    knn_search,
)
from openbook.store import KnowledgeStore


def _reference_knn(similarities, labels, num_labels, temperature, standardise=False):
    out = np.zeros((len(labels), num_labels))
    for row in range(len(labels)):
        keep = labels[row] >= 0
        if not keep.any():
            continue
        scores = similarities[row][keep].astype(np.float64)
        if standardise:
            spread = scores.std()
            scores = (scores - scores.mean()) / spread if spread > 0 else np.zeros_like(scores)
        logits = scores / temperature
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        for label, weight in zip(labels[row][keep], weights, strict=True):
            out[row, label] += weight
    return out


def test_knn_distribution_matches_loop_reference():
    rng = np.random.default_rng(0)
    similarities = rng.uniform(-1, 1, size=(7, 5)).astype(np.float32)
    labels = rng.integers(0, 3, size=(7, 5))
    labels[2, 3:] = -1  # fewer neighbours than k
    similarities[2, 3:] = -np.inf
    labels[4] = -1  # no neighbours at all
    similarities[4] = -np.inf
    got = knn_distribution(torch.from_numpy(similarities), torch.from_numpy(labels), 3, 0.1).numpy()
    np.testing.assert_allclose(got, _reference_knn(similarities, labels, 3, 0.1), atol=1e-6)
    np.testing.assert_allclose(got[[0, 1, 2, 3, 5, 6]].sum(-1), 1.0, atol=1e-6)
    assert got[4].sum() == 0


def test_low_temperature_approaches_nearest_neighbour_vote():
    similarities = torch.tensor([[0.9, 0.8, 0.1]])
    labels = torch.tensor([[1, 0, 0]])
    sharp = knn_distribution(similarities, labels, 2, 0.001)
    flat = knn_distribution(similarities, labels, 2, 100.0)
    assert sharp[0, 1] > 0.99
    assert flat[0, 0] == pytest.approx(2 / 3, abs=1e-3)


def test_interpolation_is_the_linear_mixture_in_probability_space():
    p_knn = torch.tensor([[0.9, 0.1], [0.0, 0.0]])
    p_lm = torch.tensor([[0.2, 0.8], [0.3, 0.7]])
    mixed = interpolate(p_knn, p_lm, 0.25)
    torch.testing.assert_close(mixed[0], 0.25 * p_knn[0] + 0.75 * p_lm[0])
    torch.testing.assert_close(mixed[1], p_lm[1])  # no neighbours: P_LM alone, still a distribution
    torch.testing.assert_close(mixed.sum(-1), torch.ones(2))


@pytest.mark.parametrize("kwargs", [{"k": 0}, {"temperature": 0.0}, {"lam": 1.5}])
def test_knn_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        KnnConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"similarity": "euclidean"}, {"standardise": 1}])
def test_knn_config_rejects_unknown_scoring(kwargs):
    with pytest.raises(ValueError):
        KnnConfig(**kwargs)


def _old_knn_distribution(similarities, labels, num_labels, temperature):
    """knn_distribution as it was before the scoring options, line for line."""
    present = labels >= 0
    logits = (similarities / temperature).masked_fill(~present, float("-inf"))
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    p_knn = torch.zeros(labels.shape[0], num_labels, dtype=weights.dtype)
    return p_knn.scatter_add_(1, labels.clamp(min=0), weights)


def test_the_cosine_scoring_gives_exactly_the_numbers_it_gave_before(filled_store):
    """The default before centring, k = 16, T = 0.1, cosine, unstandardised: the old path bit for bit."""
    store, _ = filled_store(200, seed=3)
    queries = np.random.default_rng(4).normal(size=(9, store.dim))
    before = store.search(queries, 16, exclude_ids=np.arange(9))
    after = knn_search(store, queries, 16, "cosine", exclude_ids=np.arange(9))
    for field in ("ids", "labels", "similarities"):
        np.testing.assert_array_equal(getattr(after, field), getattr(before, field))
    p_lm = np.full((9, 4), 0.25, np.float32)
    p_knn, _ = knn_mixture(p_lm, after.similarities, after.labels, KnnConfig(similarity="cosine"))
    old = _old_knn_distribution(
        torch.from_numpy(before.similarities), torch.from_numpy(before.labels), 4, 0.1
    )
    np.testing.assert_array_equal(p_knn, old.numpy())


def test_standardised_distribution_matches_loop_reference():
    rng = np.random.default_rng(1)
    similarities = rng.uniform(0.85, 0.95, size=(8, 6)).astype(np.float32)
    labels = rng.integers(0, 3, size=(8, 6))
    labels[2, 4:], similarities[2, 4:] = -1, -np.inf  # fewer neighbours than k
    labels[4], similarities[4] = -1, -np.inf  # none at all
    labels[5, 1:], similarities[5, 1:] = -1, -np.inf  # one: no spread, all its weight
    similarities[6] = 0.9  # all equally similar: equal weights
    got = knn_distribution(torch.from_numpy(similarities), torch.from_numpy(labels), 3, 0.5, True).numpy()
    np.testing.assert_allclose(got, _reference_knn(similarities, labels, 3, 0.5, standardise=True), atol=1e-5)
    assert got[4].sum() == 0 and got[5, labels[5, 0]] == pytest.approx(1.0)
    np.testing.assert_allclose(got[6], np.bincount(labels[6], minlength=3) / 6, atol=1e-6)


def test_standardising_reads_only_each_query_s_spread():
    """Standardised, P_kNN does not change when a row's similarities are scaled and shifted, and it
    is the unstandardised P_kNN at temperature T times the row's standard deviation."""
    rng = np.random.default_rng(2)
    similarities = torch.from_numpy(rng.uniform(0.9, 0.95, size=(5, 8)))
    labels = torch.from_numpy(rng.integers(0, 2, size=(5, 8)))
    standardised = knn_distribution(similarities, labels, 2, 1.0, standardise=True)
    moved = knn_distribution(20 * similarities - 3, labels, 2, 1.0, standardise=True)
    torch.testing.assert_close(moved, standardised)
    for row in range(5):
        spread = float(similarities[row].std(unbiased=False))
        row_at = knn_distribution(similarities[row : row + 1], labels[row : row + 1], 2, spread)
        torch.testing.assert_close(row_at[0], standardised[row])


def _reference_centred_cosine(queries, keys, centre):
    out = np.zeros((len(queries), len(keys)))
    for i, q in enumerate(queries):
        for j, v in enumerate(keys):
            a, b = q - centre, v - centre
            norms = np.linalg.norm(a) * np.linalg.norm(b)
            out[i, j] = a @ b / norms if norms > 0 else 0.0
    return out


def test_centred_cosine_matches_loop_reference():
    rng = np.random.default_rng(5)
    keys = rng.normal(size=(7, 6))
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    centre = keys.mean(0)
    queries = np.concatenate([keys[:2], centre[None] / 1.0])  # the last one is the centre itself: 0
    got = centred_cosine(queries, keys, centre)
    assert got.dtype == np.float32 and got.shape == (3, 7)
    np.testing.assert_allclose(got, _reference_centred_cosine(queries, keys, centre), atol=1e-6)
    assert np.all(got[2] == 0.0)


def _dominated_items(count, seed, dim=16, num_labels=3):
    """Unit keys that share one dominant direction, as a causal LM's slot vectors do (cosine ~0.93)."""
    rng = np.random.default_rng(seed)
    common = np.zeros(dim)
    common[0] = 1.0
    vectors = 3.0 * common + 0.2 * rng.normal(size=(count, dim))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.arange(count, dtype=np.int64) * 3 + 1, vectors, rng.integers(0, num_labels, size=count)


def _brute_force_centred(ids, vectors, labels, queries, k, candidates, exclude=None):
    """The `candidates` best by raw cosine (excluding `exclude[b]`), re-ranked by centred cosine: top k."""
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    raw = unit_queries @ vectors.T
    centred = _reference_centred_cosine(unit_queries, vectors, vectors.mean(0))
    top_ids = np.full((len(queries), k), -1)
    top_sims = np.full((len(queries), k), -np.inf)
    for b in range(len(queries)):
        allowed = np.ones(len(ids), bool) if exclude is None else ids != exclude[b]
        pool = np.flatnonzero(allowed)[np.argsort(-raw[b, allowed], kind="stable")[:candidates]]
        best = pool[np.argsort(-centred[b, pool], kind="stable")[:k]]
        top_ids[b, : len(best)], top_sims[b, : len(best)] = ids[best], centred[b, best]
    return top_ids, top_sims, labels


@pytest.mark.parametrize("count", [5, 12, 300])  # fewer keys than k; the whole store re-ranked; 4k of it
def test_centred_search_matches_brute_force(count):
    ids, vectors, labels = _dominated_items(count, seed=count)
    store = KnowledgeStore(vectors.shape[1])
    store.add(ids, vectors, labels)
    queries = _dominated_items(6, seed=99)[1]
    k = 8
    candidates = min(count, RERANK_WIDTH * k)
    for exclude in (None, ids[np.arange(6) % count]):  # some queries' own neighbour left out
        got = knn_search(store, queries, k, "centred", exclude_ids=exclude)
        ref_ids, ref_sims, _ = _brute_force_centred(ids, vectors, labels, queries, k, candidates, exclude)
        np.testing.assert_array_equal(got.ids, ref_ids)
        np.testing.assert_allclose(got.similarities, ref_sims, atol=1e-5)
        label_of = dict(zip(ids.tolist(), labels.tolist(), strict=True))
        np.testing.assert_array_equal(got.labels, [[label_of.get(i, -1) for i in row] for row in got.ids])


def test_centring_separates_what_the_dominant_direction_hides():
    """Keys at cosine ~0.93 to each other: raw cosines at T = 0.1 barely prefer the query's twin,
    the centred cosine puts nearly all the weight on it."""
    ids, vectors, labels = _dominated_items(8, seed=7, num_labels=2)
    labels = np.array([0, 1] * 4)
    store = KnowledgeStore(vectors.shape[1])
    store.add(ids, vectors, labels)
    twin = vectors[3] + 0.01 * np.random.default_rng(8).normal(size=vectors.shape[1])  # label 1
    p_lm = np.full((1, 2), 0.5, np.float32)
    shares = {}
    for similarity in ("cosine", "centred"):
        hits = knn_search(store, twin[None], 8, similarity)
        shares[similarity] = knn_mixture(p_lm, hits.similarities, hits.labels, KnnConfig())[0][0, 1]
    assert shares["cosine"] < 0.7 and shares["centred"] > 0.9
