"""Exact multi-token label scores in one pass (openbook/word_scores.py) against the per-label loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from openbook import word_scores
from openbook.backbone import Backbone, BackboneConfig
from openbook.prompting import Template, Verbalizer
from openbook.word_scores import word_tree

TEMPLATE = Template("{text} It was {mask}")
# Left-padded rows of different lengths; the longest runs past the small sliding windows below.
TEXTS = [
    "a bad film",
    "the movie was great and fun , a good film with a great cast , it was not boring",
    "yes",
]


def label_words(tokenizer) -> list[list[int]]:
    """Words sharing prefixes, of lengths 1 to 5, single-token words among them, one word twice."""
    a, b, c, d, e, f, g, h, i, j = (tokenizer.convert_tokens_to_ids(t) for t in "abcdefghij")
    return [[a], [a, b], [a, b, c], [a, d], [e, f, g, h, i], [e, f, j], [j], [c, a], [a, b], [b]]


def per_label_loop(backbone: Backbone, batch, label_token_ids: list[list[int]]) -> torch.Tensor:
    """The reference: each label's tail teacher-forced on the prompt's KV cache, one call per label (the
    loop `Backbone.forward` ran before the tree). Its cache keeps every key (no config): cropping a
    sliding-window cache that has dropped keys fails."""
    from transformers import DynamicCache

    batch = batch.to(backbone.device)
    out = backbone.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        past_key_values=DynamicCache(),
        use_cache=True,
    )
    log_probs = F.log_softmax(out.logits[:, -1].float(), dim=-1)
    cache = out.past_key_values
    columns = []
    for ids in label_token_ids:
        score = log_probs[:, ids[0]]
        if len(ids) > 1:
            tail = torch.tensor(ids, device=backbone.device)
            steps = len(ids) - 1
            feed = tail[:-1].expand(len(score), steps)
            mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones(len(score), steps)], 1)
            positions = batch.position_ids[:, -1:] + torch.arange(1, steps + 1, device=backbone.device)
            step = backbone.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            tail_log_probs = F.log_softmax(step.logits.float(), dim=-1)
            score = score + tail_log_probs[:, torch.arange(steps), tail[1:]].sum(-1)
            cache.crop(-steps)
        columns.append(score)
    return torch.stack(columns, dim=-1)


@pytest.fixture(scope="module")
def mixed_gemma(mixed_gemma_dir: Path) -> Backbone:
    from openbook.backbone import load_backbone

    return load_backbone(BackboneConfig(name=str(mixed_gemma_dir), max_length=48))


@pytest.fixture(params=["llama", "gemma", "mixed_gemma"])
def decoder(request: pytest.FixtureRequest) -> Backbone:
    name = {"llama": "causal_backbone", "gemma": "gemma_backbone"}.get(request.param, request.param)
    return request.getfixturevalue(name)


def test_tree_shares_prefixes_and_keeps_each_words_factors(causal_backbone) -> None:
    words = label_words(causal_backbone.tokenizer)
    (tree,) = word_tree(words).trees
    prefixes = {tuple(w[:d]) for w in words for d in range(1, len(w))}
    assert len(tree.tokens) == len(prefixes) < sum(len(w) - 1 for w in words)  # shared once
    assert tree.edge_label.bincount(minlength=len(words)).tolist() == [len(w) - 1 for w in words]
    for node, child, label in zip(tree.edge_node, tree.edge_child, tree.edge_label, strict=True):
        word = words[int(label)]
        depth = int(tree.depth[node])
        path = tree.on_path[node].nonzero().flatten()
        assert sorted(tree.tokens[path].tolist()) == sorted(word[:depth])  # the node is w1..wd
        assert int(tree.children[node, child]) == word[depth]


def test_one_pass_matches_the_per_label_loop(decoder: Backbone) -> None:
    encoder = decoder.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS)
    assert batch.attention_mask.shape[1] > 16 and not batch.attention_mask.all()  # past the windows, padded
    words = label_words(decoder.tokenizer)
    with torch.no_grad():
        got = decoder.forward(batch, words).label_log_probs
        want = per_label_loop(decoder, batch, words)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(got[:, 1], got[:, 8])  # the same word, the same score


def test_a_label_set_past_the_node_budget_is_split_into_trees_each_on_its_own_cache(
    decoder: Backbone, monkeypatch
) -> None:
    """Trees of at most MAX_TREE_NODES nodes (a longer word alone in its own), every word's factors in
    exactly one, the same scores as the per-label loop, and the prompt's cache as each pass found it."""
    monkeypatch.setattr(word_scores, "MAX_TREE_NODES", 3)
    encoder = decoder.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS)
    words = label_words(decoder.tokenizer)
    split = word_scores._label_words(tuple(tuple(w) for w in words), 3)
    assert len(split.trees) > 2
    assert all(len(tree.tokens) <= 3 or tree.edge_label.unique().numel() == 1 for tree in split.trees)
    factors = torch.cat([tree.edge_label for tree in split.trees]).bincount(minlength=len(words))
    assert factors.tolist() == [len(w) - 1 for w in words]
    calls = []
    handle = decoder.model.base_model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with torch.no_grad():
            got = decoder.forward(batch, words).label_log_probs
    finally:
        handle.remove()
    assert len(calls) == 1 + len(split.trees)
    torch.testing.assert_close(got, per_label_loop(decoder, batch, words), atol=1e-4, rtol=0)


def test_model_calls_do_not_grow_with_the_label_count(causal_backbone, monkeypatch) -> None:
    encoder = causal_backbone.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS)
    few = label_words(causal_backbone.tokenizer)[:3]
    many = [[token, *tail] for token in range(3, 40) for tail in ([], [5], [5, 7], [9])]  # 148 words
    calls = []
    handle = causal_backbone.model.base_model.register_forward_pre_hook(lambda *_: calls.append(1))
    monkeypatch.setattr(word_scores, "LOGIT_BUDGET", 7 * len(causal_backbone.tokenizer))  # chunks of 7 rows
    try:
        with torch.no_grad():
            for words in (few, many):
                calls.clear()
                got = causal_backbone.forward(batch, words).label_log_probs
                assert len(calls) == 2  # the prompt, then every word's tail at once
                torch.testing.assert_close(
                    got, per_label_loop(causal_backbone, batch, words), atol=1e-4, rtol=0
                )
    finally:
        handle.remove()


def test_gradients_match_the_per_label_loop(gemma_backbone, monkeypatch) -> None:
    """Training backpropagates through the tree pass, its head chunks recomputed in the backward."""
    monkeypatch.setattr(word_scores, "LOGIT_BUDGET", 5 * len(gemma_backbone.tokenizer))
    encoder = gemma_backbone.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(TEXTS[:2])
    words = label_words(gemma_backbone.tokenizer)
    weight = gemma_backbone.model.base_model.layers[0].mlp.down_proj.weight
    grads = []
    for scores in (
        lambda: gemma_backbone.forward(batch, words).label_log_probs,
        lambda: per_label_loop(gemma_backbone, batch, words),
    ):
        weight.grad = None
        scores().logsumexp(-1).sum().backward()
        grads.append(weight.grad.clone())
    weight.grad = None
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", ["prompt-ft", "lora"])
def test_a_training_step_on_150_labels_makes_two_model_calls(causal_dir: Path, spec: str) -> None:
    import numpy as np
    from openbook.backbone import load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import build_method
    from openbook.methods.base import TrainBatch

    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    names = tuple(str(i) for i in range(150))
    verbalizer = Verbalizer(names, tuple(f"w{i} x" for i in range(150)))  # each 2 or more tokens
    method = build_method(spec)
    classifier = method.prepare(Classifier(backbone, TEMPLATE, verbalizer))
    assert min(len(ids) for ids in classifier.encoder.label_token_ids) > 1
    classifier.embed(TEXTS)  # the words' tree is first built under inference mode, then trained through
    calls = []
    handle = classifier.backbone.model.base_model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        loss = method.loss(classifier, TrainBatch(TEXTS, torch.tensor([0, 75, 149]), np.arange(3)))
        loss.backward()
    finally:
        handle.remove()
    assert torch.isfinite(loss) and len(calls) == 2


@pytest.mark.parametrize("directory", ["causal_dir", "gemma_dir"])
def test_a_key_value_prefix_scores_words_as_the_same_virtual_tokens_do(
    directory: str, request: pytest.FixtureRequest
) -> None:
    """Prefix tuning and prompt tuning both start from the label words (init=labels): the model reads the
    same tokens, once as a prefix cache and once as inputs, so the tree pass over a cache that holds a
    prefix (and, on Gemma, has dropped keys past its window) must score the words alike."""
    from openbook.backbone import load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import build_method

    backbone = load_backbone(BackboneConfig(name=str(request.getfixturevalue(directory)), max_length=48))
    verbalizer = Verbalizer.parse("0=boring,1=wonderful,2=bad,3=awful film")
    scores = []
    for spec in ("prefix-tuning", "prompt-tuning"):
        classifier = build_method(spec).prepare(Classifier(backbone, TEMPLATE, verbalizer))
        assert classifier.prompt is not None
        scores.append(classifier.embed(TEXTS).lm_log_probs)
    assert max(len(ids) for ids in classifier.encoder.label_token_ids) > 1
    torch.testing.assert_close(torch.from_numpy(scores[0]), torch.from_numpy(scores[1]), atol=1e-4, rtol=0)


def test_label_vectors_give_the_exact_distribution_over_single_token_words(any_backbone) -> None:
    """h · v_c is a one-token word's logit, so over such words `vectors` is the exact P_LM, renormalised."""
    encoder = any_backbone.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good,2=great,3=fun"))
    assert all(len(ids) == 1 for ids in encoder.label_token_ids)
    batch = encoder.encode(TEXTS)
    with torch.no_grad():
        exact = any_backbone.forward(batch, encoder.label_token_ids)
        vectors = any_backbone.forward(batch, encoder.label_token_ids, scoring="vectors")
    torch.testing.assert_close(vectors.hidden, exact.hidden)
    torch.testing.assert_close(
        vectors.label_log_probs, exact.label_log_probs.log_softmax(-1), atol=1e-5, rtol=0
    )


def test_label_vectors_score_multi_token_words_by_their_mean_row_without_head_or_tree(decoder) -> None:
    words = label_words(decoder.tokenizer)
    batch = decoder.encoder(TEMPLATE, Verbalizer.parse("0=bad,1=good")).encode(TEXTS)
    body, head_rows = [], []
    hooks = [
        decoder.model.base_model.register_forward_pre_hook(lambda *_: body.append(1)),
        decoder.output_head.register_forward_hook(lambda _m, _i, out: head_rows.append(out.shape[1])),
    ]
    try:
        with torch.no_grad():
            got = decoder.forward(batch, words, scoring="vectors")
    finally:
        for hook in hooks:
            hook.remove()
    assert body == [1] and head_rows == [0]  # one pass, and the head computes no logit
    weight = decoder.output_head.weight
    means = torch.stack([weight[ids].mean(0) for ids in words])  # (C, H)
    # The head's input at a causal slot is the last layer's (normed) state, the slot vector itself.
    torch.testing.assert_close(got.label_log_probs, (got.hidden @ means.T).log_softmax(-1), atol=1e-5, rtol=0)
    assert not torch.equal(got.label_log_probs[:, 1], got.label_log_probs[:, 2])  # shared first token
