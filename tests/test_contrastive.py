"""The contrastive loss on the slot space, against the store (openbook/contrastive.py), and its option
in retroprompt."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.contrastive import class_balanced_batches, store_contrastive_loss, supervised_contrastive_loss
from openbook.store import KnowledgeStore

from tests.methods.test_retroprompt import DISTINCT


def _store(vectors: np.ndarray, labels: list[int]) -> KnowledgeStore:
    store = KnowledgeStore(vectors.shape[1])
    store.add(np.arange(len(vectors)), vectors.astype(np.float32), np.array(labels))
    return store


def test_loss_matches_the_formula_and_leaves_the_anchor_out() -> None:
    keys = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-0.8, 0.6]], dtype=np.float32)
    store = _store(keys, [0, 0, 1, 2])
    anchor = torch.tensor([[0.8, 0.6]], requires_grad=True)
    loss = store_contrastive_loss(anchor, np.array([0]), torch.tensor([0]), store, temperature=0.5)
    # anchor id 0: candidates are keys 1 (label 0, the one positive), 2 and 3
    s = torch.tensor([0.8 * 0.6 + 0.6 * 0.8, 0.6, -0.8 * 0.8 + 0.6 * 0.6]) / 0.5
    assert loss.item() == pytest.approx(-(s[0] - torch.logsumexp(s, 0)).item(), abs=1e-6)
    loss.backward()
    assert anchor.grad is not None and torch.isfinite(anchor.grad).all()


def test_the_loss_averages_over_positives_then_over_anchors_that_have_one() -> None:
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(6, 4)).astype(np.float32)
    labels = [0, 0, 0, 1, 1, 2]
    store = _store(keys, labels)
    anchor_ids = np.array([0, 3, 5])  # two positives, one positive, none
    anchors = rng.normal(size=(3, 4)).astype(np.float32)
    temperature = 0.3
    loss = store_contrastive_loss(
        torch.from_numpy(anchors), anchor_ids, torch.tensor([0, 1, 2]), store, temperature
    )
    unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    per_anchor = []
    for anchor, own in zip(anchors, anchor_ids, strict=True):
        others = [j for j in range(6) if j != own]
        s = {j: float(unit[j] @ (anchor / np.linalg.norm(anchor))) / temperature for j in others}
        log_z = np.log(sum(np.exp(v) for v in s.values()))
        positives = [j for j in others if labels[j] == labels[own]]
        if positives:  # an anchor with no positive is left out of the mean, not counted as a zero
            per_anchor.append(-np.mean([s[j] - log_z for j in positives]))
    assert len(per_anchor) == 2
    assert loss.item() == pytest.approx(float(np.mean(per_anchor)), abs=1e-5)


def test_an_anchor_without_positive_adds_nothing_and_keeps_the_graph() -> None:
    store = _store(np.eye(3), [0, 1, 2])  # every label once: no anchor has a positive besides itself
    anchors = torch.randn(3, 3, requires_grad=True)
    loss = store_contrastive_loss(anchors, np.arange(3), torch.tensor([0, 1, 2]), store, 0.07)
    assert loss.item() == 0.0
    loss.backward()
    assert anchors.grad is not None and (anchors.grad == 0).all()


def _label_gap(vectors: np.ndarray, labels: np.ndarray) -> float:
    """Mean cosine between same-label pairs minus that between different-label pairs."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosine = unit @ unit.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    return float(cosine[same & off_diagonal].mean() - cosine[~same].mean())


def test_the_loss_pulls_same_label_slot_vectors_together(causal_dir: Path, fresh_classifier) -> None:
    classifier, _ = fresh_classifier(causal_dir, "retroprompt")
    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    ids = np.arange(len(DISTINCT))
    before = classifier.embed(DISTINCT, vectors_only=True).vectors
    parameters = [p for p in classifier.backbone.model.parameters() if p.is_floating_point()]
    optimizer = torch.optim.SGD(parameters, lr=0.05)
    gold = torch.as_tensor(labels)
    classifier.backbone.model.train()
    for _ in range(5):  # the store holds the current keys, as training's re-embedding keeps it
        store = _store(classifier.embed(DISTINCT, vectors_only=True).vectors, labels.tolist())
        batch = classifier.encoder.encode(DISTINCT)
        hidden = classifier.backbone.forward(batch, classifier.encoder.label_token_ids).hidden
        loss = store_contrastive_loss(hidden, ids, gold, store, temperature=0.07)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    classifier.backbone.model.eval()
    after = classifier.embed(DISTINCT, vectors_only=True).vectors
    assert _label_gap(after, labels) > _label_gap(before, labels) + 0.05


def test_the_option_trains_and_is_off_by_default(causal_dir: Path, fresh_classifier, monkeypatch) -> None:
    from openbook.methods import build_method
    from openbook.methods.base import MethodError, TrainBatch
    from openbook.methods.retroprompt import RetroPromptConfig

    assert RetroPromptConfig().contrastive == 0.0
    assert build_method("retroprompt/contrastive=0.5").config.contrastive == 0.5
    with pytest.raises(MethodError, match="add contrastive=W"):
        build_method("retroprompt/contrastive-temperature=0.1")
    with pytest.raises(MethodError, match="non-negative"):
        build_method("retroprompt/contrastive=-1")

    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    batch = TrainBatch(DISTINCT[:4], torch.as_tensor(labels[:4]), np.arange(4))
    losses = {}
    specs = ("retroprompt", "retroprompt/contrastive=1", "retroprompt/demos=neural/contrastive=1")
    for spec in specs:
        classifier, method = fresh_classifier(causal_dir, spec)
        classifier.add_examples(DISTINCT, [classifier.labels[i] for i in labels])
        losses[spec] = method.loss(classifier, batch)
        assert losses[spec].requires_grad and torch.isfinite(losses[spec])
    # with it on, the cross-entropy is the same and the contrastive term adds to it, at its weight
    assert losses["retroprompt/contrastive=1"] > losses["retroprompt"]
    classifier, method = fresh_classifier(causal_dir, "retroprompt/contrastive=0.5")
    classifier.add_examples(DISTINCT, [classifier.labels[i] for i in labels])
    term = store_contrastive_loss(
        classifier.plain_forward(batch.texts).hidden, batch.ids, batch.gold, classifier.store, 0.07
    )
    assert term.item() > 0
    assert method.loss(classifier, batch).item() == pytest.approx(
        losses["retroprompt"].item() + 0.5 * term.item(), rel=1e-4
    )

    def refuse(*args, **kwargs):
        raise AssertionError("the contrastive loss ran with the option off")

    monkeypatch.setattr("openbook.methods.retroprompt.store_contrastive_loss", refuse)
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    classifier.add_examples(DISTINCT, [classifier.labels[i] for i in labels])
    assert method.loss(classifier, batch).item() == pytest.approx(losses["retroprompt"].item())


def test_retroprompt_trains_with_the_contrastive_loss(
    causal_dir: Path, fresh_classifier, monkeypatch
) -> None:
    import openbook.methods.retroprompt
    from openbook.training import train

    from tests.methods.test_retroprompt import QUICK

    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return store_contrastive_loss(*args, **kwargs)

    monkeypatch.setattr(openbook.methods.retroprompt, "store_contrastive_loss", counted)
    classifier, method = fresh_classifier(causal_dir, "retroprompt/demos=neural/contrastive=0.5")
    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    result = train(classifier, method, DISTINCT, labels, DISTINCT[:2], labels[:2], QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()
    assert len(calls) == QUICK.steps  # one contrastive term a step
    assert len(classifier.predict(DISTINCT[:2])) == 2


@pytest.mark.parametrize("spec", ["retroprompt/contrastive=0.5", "retroprompt/demos=neural/contrastive=0.5"])
def test_the_contrastive_step_scores_labels_as_the_classifier_does(
    causal_dir: Path, fresh_classifier, monkeypatch, spec: str
) -> None:
    """With label vectors, no training forward runs the pass over the words' tree: the contrastive
    step's own forward scores the labels as the classifier serves them (at 150 labels, exact scoring
    there made a step several times slower)."""
    import dataclasses

    import openbook.backbone
    from openbook.prompting import Verbalizer
    from openbook.training import train

    from tests.methods.test_retroprompt import QUICK

    classifier, method = fresh_classifier(causal_dir, spec)
    words = Verbalizer.parse("0=very bad film,1=very good film")  # multi-token words: exact runs the tree
    classifier = method.prepare(dataclasses.replace(classifier, verbalizer=words, label_scoring="vectors"))

    def tree_pass(*args, **kwargs):
        raise AssertionError("the words' tree was scored exactly")

    monkeypatch.setattr(openbook.backbone, "word_log_probs", tree_pass)
    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    result = train(classifier, method, DISTINCT, labels, DISTINCT[:2], labels[:2], QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()


# The batch form (sentence_reader.py's tuning): a fast path against a reference loop.


def _reference_loss(z: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Khosla et al.'s L_out, anchor by anchor, pair by pair."""
    z = torch.nn.functional.normalize(z.double(), dim=-1)
    per_anchor = []
    for i in range(len(z)):
        others = [a for a in range(len(z)) if a != i]
        positives = [p for p in others if labels[p] == labels[i]]
        if not positives:
            continue
        denominator = sum(math.exp(float(z[i] @ z[a]) / temperature) for a in others)
        terms = [math.log(math.exp(float(z[i] @ z[p]) / temperature) / denominator) for p in positives]
        per_anchor.append(-sum(terms) / len(positives))
    return sum(per_anchor) / len(per_anchor)


@pytest.mark.parametrize("seed", range(5))
def test_contrastive_loss_matches_the_reference_loop(seed):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(12, 8, generator=generator) * 3  # not unit: the loss compares by cosine
    labels = torch.randint(0, 4, (12,), generator=generator)
    labels[-1] = 9  # a label seen once: an anchor without positives, still a negative for the others
    temperature = [0.05, 0.1, 0.5, 1.0, 2.0][seed]
    fast = supervised_contrastive_loss(z, labels, temperature)
    assert float(fast) == pytest.approx(_reference_loss(z, labels, temperature), rel=1e-5)


def test_contrastive_loss_without_positives_is_zero_and_keeps_the_graph():
    z = torch.randn(4, 8, requires_grad=True)
    loss = supervised_contrastive_loss(z, torch.arange(4), 0.1)
    loss.backward()
    assert loss.item() == 0.0 and z.grad is not None


def test_class_balanced_batches_give_every_anchor_a_positive_and_every_class_its_turn():
    labels = np.repeat(np.arange(10), [5, 5, 5, 5, 5, 5, 5, 5, 5, 1])  # ten labels, one of a single text
    batches = list(class_balanced_batches(labels, 8, 50, seed=3))
    again, reseeded = (
        class_balanced_batches(labels, 8, 50, seed=3),
        class_balanced_batches(labels, 8, 50, seed=4),
    )
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, reseeded, strict=True))
    drawn = np.zeros(10, dtype=int)
    for batch in batches:
        assert len(batch) <= 8 and len(set(batch.tolist())) == len(batch)
        counts = np.bincount(labels[batch], minlength=10)
        assert all(counts[label] >= 2 for label in np.flatnonzero(counts) if label != 9)
        drawn += counts > 0
    assert drawn.max() - drawn.min() <= 2  # 4 classes a batch, in shuffled passes over the 10
