import numpy as np
import pytest
import torch
from openbook.demonstrations import (
    DemoConfig,
    nearest_classes,
    retrieve_demonstrations,
    retrieve_texts,
    to_input_space,
    to_words,
    token_statistics,
)
from openbook.store import KnowledgeStore


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_demo_vector_is_softmax_weighted_mean_of_top_m_per_class():
    rng = np.random.default_rng(0)
    dim, per_class, classes = 8, 5, 3
    vectors = _unit(rng.standard_normal((per_class * classes, dim))).astype(np.float32)
    labels = np.repeat(np.arange(classes), per_class)
    store = KnowledgeStore(dim)
    store.add(np.arange(len(vectors)), vectors, labels)
    queries = _unit(rng.standard_normal((2, dim))).astype(np.float32)
    config = DemoConfig(m=2, temperature=0.2)
    demos = retrieve_demonstrations(store, queries, classes, config)
    assert demos.vectors.shape == (2, classes, dim)
    for b in range(2):
        for c in range(classes):
            members = np.flatnonzero(labels == c)
            sims = vectors[members] @ queries[b]
            top = members[np.argsort(-sims)[:2]]
            weights = np.exp(np.sort(sims)[::-1][:2] / 0.2)
            weights /= weights.sum()
            np.testing.assert_allclose(demos.vectors[b, c], weights @ vectors[top], atol=1e-5)
            assert sorted(demos.ids[b, c].tolist()) == sorted(top.tolist())


def test_leave_one_out_and_missing_class():
    dim = 4
    vectors = np.eye(dim, dtype=np.float32)[:3]
    store = KnowledgeStore(dim)
    store.add([0, 1, 2], vectors, [0, 0, 1])
    demos = retrieve_demonstrations(store, vectors[:1], 3, DemoConfig(m=2), exclude_ids=np.array([0]))
    assert 0 not in demos.ids[0].ravel().tolist()
    np.testing.assert_allclose(demos.vectors[0, 0], vectors[1], atol=1e-6)  # only id 1 is left in class 0
    assert (demos.ids[0, 2] == -1).all() and np.allclose(demos.vectors[0, 2], 0)  # class 2 has no examples


def test_input_space_mapping_centres_classes_and_places_them_among_tokens():
    embedding = torch.randn(50, 6) * 3 + 1.0
    vectors = np.array([[[1.0, 0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]], dtype=np.float32)
    mapped = to_input_space(vectors, embedding, 1.0)  # (1, 3, 6); class 2 has no neighbours
    token_mean = embedding.mean(0)
    spread = (embedding - token_mean).norm(dim=-1).mean()
    for c in (0, 1):
        torch.testing.assert_close((mapped[0, c] - token_mean).norm(), spread)
    # Two classes centred on their mean point in opposite directions: only their difference is kept.
    torch.testing.assert_close(mapped[0, 0] - token_mean, -(mapped[0, 1] - token_mean))
    direction = (mapped[0, 0] - token_mean) / spread
    torch.testing.assert_close(direction, torch.tensor([1.0, -1.0, 0, 0, 0, 0]) / 2**0.5)
    torch.testing.assert_close(mapped[0, 2], token_mean)  # no neighbour: the centre, not a zero row


def test_input_space_is_the_token_embeddings_as_the_model_reads_them(any_backbone):
    """Gemma 3 multiplies its embedding table by sqrt(hidden size) inside the embedding module: the mapped
    vectors sit among the embeddings the module returns, not among the raw table's rows."""
    backbone = any_backbone
    tokens = backbone.input_embeddings(torch.arange(len(backbone.tokenizer), device=backbone.device)).float()
    token_mean = tokens.mean(0)
    spread = (tokens - token_mean).norm(dim=-1).mean()
    vectors = np.zeros((1, 3, backbone.hidden_size), dtype=np.float32)
    vectors[0, 0, 0] = vectors[0, 1, 1] = 1.0  # class 2 has no neighbours
    mapped = to_input_space(vectors, backbone.input_embeddings.weight, backbone.input_embedding_scale)
    torch.testing.assert_close(mapped[0, 2], token_mean, atol=1e-5, rtol=1e-4)
    for c in (0, 1):
        torch.testing.assert_close((mapped[0, c] - token_mean).norm(), spread, atol=1e-5, rtol=1e-4)


def _fresh_statistics(table: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = table.detach().float()
    mean = rows.mean(0)
    return mean * scale, (rows - mean).norm(dim=-1).mean() * scale


def test_token_statistics_are_kept_until_the_table_changes(monkeypatch):
    """Kept while the table is unchanged; an optimiser step, a load_state_dict, a dtype change or another
    table gets statistics computed afresh, equal to a pass over the whole table in one piece."""
    monkeypatch.setattr("openbook.demonstrations._STATISTICS_ROWS", 7)  # several pieces of a 50-row table
    embedding = torch.nn.Embedding(50, 6)
    table = embedding.weight
    first = token_statistics(table, 2.0)
    torch.testing.assert_close(first, _fresh_statistics(table, 2.0))
    assert token_statistics(table, 2.0)[0] is first[0]  # unchanged: kept
    assert token_statistics(table, 3.0)[0] is not first[0]  # another scale

    optimizer = torch.optim.SGD(embedding.parameters(), lr=1.0)
    embedding(torch.arange(50)).pow(2).sum().backward()
    optimizer.step()
    for changed in (
        lambda: None,  # the step above
        lambda: embedding.load_state_dict({"weight": torch.randn(50, 6)}),
        lambda: setattr(table, "data", table.data.to(torch.bfloat16)),
    ):
        changed()
        torch.testing.assert_close(
            token_statistics(table, 2.0), _fresh_statistics(table, 2.0), rtol=1e-5, atol=1e-5
        )
    other = torch.randn(50, 6)
    torch.testing.assert_close(token_statistics(other, 2.0), _fresh_statistics(other, 2.0))
    with torch.inference_mode():
        made_in_inference = torch.randn(50, 6)  # no version counter: computed, not kept
    torch.testing.assert_close(
        token_statistics(made_in_inference, 2.0), _fresh_statistics(made_in_inference, 2.0)
    )


def test_text_demonstrations_are_nearest_first_in_label_order_and_leave_one_out():
    # Ids 0-5 on a circle: labels 0, 1, 2, 0, 1, 2; query = item 0's own vector.
    angles = np.linspace(0, 1.5, 6)
    vectors = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    store = KnowledgeStore(2)
    store.add(np.arange(6), vectors, [0, 1, 2, 0, 1, 2], texts=[f"text {i}" for i in range(6)])
    shown = retrieve_texts(store, vectors[:1], 3, DemoConfig(m=2, mode="text"))
    # Rank by rank, classes in label order: the nearest of each class, then the second nearest.
    assert shown == [
        [("text 0", 0), ("text 1", 1), ("text 2", 2), ("text 3", 0), ("text 4", 1), ("text 5", 2)]
    ]
    alone = retrieve_texts(store, vectors[:2], 3, DemoConfig(m=1, mode="text"), exclude_ids=np.array([0, 1]))
    assert alone == [
        [("text 3", 0), ("text 1", 1), ("text 2", 2)],
        [("text 0", 0), ("text 4", 1), ("text 2", 2)],
    ]
    store.add([6], vectors[:1], [0])  # stored without its text
    with pytest.raises(KeyError, match="without its text"):
        retrieve_texts(store, vectors[:1], 3, DemoConfig(m=1, mode="text"), exclude_ids=np.array([0]))


def test_word_mapping_places_the_input_embedding_of_the_head_argmax_word():
    vocab, hidden, embedding_dim = 5, 3, 4
    head = torch.nn.Linear(hidden, vocab, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0.6, 0.6, 0]]))
        head.bias.copy_(torch.tensor([0, 0, 0, 0, 0.5]))  # the bias counts: word 4 wins for (1, 1, 0)
    table = torch.arange(vocab * embedding_dim, dtype=torch.float32).reshape(vocab, embedding_dim)
    vectors = np.array([[[0, 0.2, 0.9], [-1.0, 0.1, 0], [1.0, 1.0, 0], [0, 0, 0]]], dtype=np.float32)
    mapped = to_words(vectors, head, table)  # (1, 4, 4); the last class has no neighbours
    assert mapped.shape == (1, 4, embedding_dim)
    for c, word in enumerate([2, 3, 4]):
        torch.testing.assert_close(mapped[0, c], table[word])
    torch.testing.assert_close(mapped[0, 3], table.mean(0))


def _nearest_classes_one_by_one(p_knn, nearest, count):
    """The reference `nearest_classes` must match: each row sorted by (-P_kNN, -nearest, label) in Python."""
    chosen = []
    for p_row, near_row in zip(p_knn.tolist(), nearest.tolist(), strict=True):
        ranked = sorted(range(len(p_row)), key=lambda c: (-p_row[c], -near_row[c], c))
        chosen.append(sorted(ranked[:count]))
    return np.array(chosen)


def test_nearest_classes_rank_by_p_knn_then_nearest_example_then_label():
    rng = np.random.default_rng(7)
    rows, labels = 64, 150
    p_knn = np.zeros((rows, labels), dtype=np.float32)
    for row in range(rows):  # a handful of classes voted for, some with equal shares
        voted = rng.choice(labels, size=rng.integers(1, 9), replace=False)
        p_knn[row, voted] = rng.choice([0.125, 0.25, 0.5], size=len(voted))
    nearest = rng.uniform(-1, 1, (rows, labels)).astype(np.float32)
    nearest[rng.random((rows, labels)) < 0.1] = -np.inf  # classes with no example
    nearest[:, 100:110] = 0.5  # ties among the unvoted too: label order breaks them
    for count in (1, 5, 16, 149):
        got = nearest_classes(p_knn, nearest, count)
        assert got.shape == (rows, count)
        np.testing.assert_array_equal(got, _nearest_classes_one_by_one(p_knn, nearest, count))
    shown = nearest_classes(p_knn, nearest, 16)  # at most 8 voted: every class P_kNN weighs is shown
    assert all(set(np.flatnonzero(p)) <= set(row) for p, row in zip(p_knn, shown, strict=True))


def _many_label_store(rows=40, labels=30, dim=8, seed=3):
    rng = np.random.default_rng(seed)
    vectors = _unit(rng.standard_normal((rows * 3, dim))).astype(np.float32)
    store = KnowledgeStore(dim)
    store.add(
        np.arange(len(vectors)),
        vectors,
        np.arange(len(vectors)) % labels,
        texts=[f"t{i}" for i in range(len(vectors))],
    )
    queries = _unit(rng.standard_normal((rows, dim))).astype(np.float32)
    p_knn = rng.dirichlet(np.ones(labels), size=rows).astype(np.float32)
    return store, queries, p_knn, labels


def test_showing_fewer_classes_keeps_those_classes_demonstrations():
    store, queries, p_knn, labels = _many_label_store()
    config = DemoConfig(m=2, temperature=0.2)
    every = retrieve_demonstrations(store, queries, labels, config)
    assert every.classes.shape == (len(queries), labels) and (every.classes == np.arange(labels)).all()
    shown = retrieve_demonstrations(store, queries, labels, config, shown=5, p_knn=p_knn)
    per_label = store.search_per_label(queries, 2, labels)
    expected = nearest_classes(p_knn, per_label.similarities[:, :, 0], 5)
    np.testing.assert_array_equal(shown.classes, expected)
    at = expected[:, :, None]
    np.testing.assert_allclose(shown.vectors, np.take_along_axis(every.vectors, at, axis=1), atol=1e-6)
    np.testing.assert_array_equal(shown.ids, np.take_along_axis(every.ids, at, axis=1))
    np.testing.assert_array_equal(shown.weights, np.take_along_axis(every.weights, at, axis=1))
    with pytest.raises(ValueError, match="needs each query's P_kNN"):
        retrieve_demonstrations(store, queries, labels, config, shown=5)
    same = retrieve_demonstrations(
        store, queries, labels, config, shown=labels, p_knn=p_knn
    )  # all: no ranking
    np.testing.assert_array_equal(same.vectors, every.vectors)


def test_written_out_demonstrations_of_fewer_classes_are_theirs_rank_by_rank():
    store, queries, p_knn, labels = _many_label_store()
    config = DemoConfig(m=2, mode="text")
    written = retrieve_texts(store, queries, labels, config, shown=4, p_knn=p_knn)
    nearest = store.search_per_label(queries, 2, labels)
    classes = nearest_classes(p_knn, nearest.similarities[:, :, 0], 4)
    for row, demos in enumerate(written):
        expected_labels = [int(c) for c in classes[row]] * 2  # every class's nearest, then its second
        assert [label for _, label in demos] == expected_labels
        nearest_texts = store.texts_of(nearest.ids[row, classes[row], 0])
        assert [text for text, _ in demos[:4]] == nearest_texts
