"""The method registry and spec parsing (`methods/base.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from openbook.backbone import BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.methods import METHODS, build_method, weights_sha256
from openbook.train_config import TrainConfig
from openbook.training import train


def test_method_specs() -> None:
    assert set(METHODS) >= {"prompt-ft", "retroprompt"}
    method = build_method("retroprompt/demos=neural/knn-loss/beta=0.5")
    assert method.config.demos == "neural" and method.config.knn_loss and method.config.beta == 0.5
    assert method.spec == "retroprompt/demos=neural/knn-loss/beta=0.5"
    # a default is left out
    assert build_method("retroprompt/no-knn-loss").spec == "retroprompt"
    assert build_method("retroprompt/demos=none").spec == "retroprompt"
    assert build_method("retroprompt/demos=text").spec == "retroprompt/demos=text"
    assert (
        build_method("retroprompt/no-knn-infer").config.training_key()
        == build_method("retroprompt").config.training_key()
    )
    for bad, match in [
        ("nope", "unknown method"),
        ("prompt-ft/demos=none", "no option"),
        ("retroprompt/no-demos", "option .demos. of retroprompt needs a value"),  # a mode, not on or off
        ("retroprompt/knn-loss/beta=x", "not a valid float"),
        ("retroprompt/knn-loss/beta=-1", "non-negative"),
        ("retroprompt/beta=0.5", "beta set the kNN-guided loss, which is off: add knn-loss"),
        ("retroprompt/beta", "needs a value"),
    ]:
        with pytest.raises(ValueError, match=match):
            build_method(bad)


# Every registered method in its default configuration, and the options that change the answer.
SPECS = [*sorted(METHODS), "retroprompt/backbone=lora"]
QUICK = TrainConfig(steps=2, batch_size=4, lr=1e-3, eval_every=1, patience=5, warmup_ratio=0.0)


def module_tree(model: torch.nn.Module) -> list[tuple]:
    """What `prepare` or training could change in place: modules, parameter objects, flags, mode."""
    return [
        (name, type(module), module.training, [(id(p), p.requires_grad) for p in module.parameters(False)])
        for name, module in model.named_modules()
    ]


@pytest.mark.parametrize("spec", SPECS)
def test_a_method_that_says_it_keeps_the_backbone_leaves_it_untouched(
    spec: str, causal_dir: Path, toy, fresh_classifier
) -> None:
    method = build_method(spec)
    assert isinstance(method.updates_backbone, bool)  # declared by every method
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    base = backbone.model
    sha, tree = weights_sha256(base), module_tree(base)
    trains_base = {id(p) for p in base.parameters()}
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    trainable = {id(p) for p in method.trainable_parameters(classifier)}
    assert bool(trainable & trains_base) == method.updates_backbone
    if method.updates_backbone:
        return
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, QUICK, progress=False)
    assert weights_sha256(base) == sha
    assert module_tree(base) == tree  # not wrapped, re-flagged or left in training mode


@pytest.mark.parametrize(
    ("spec", "model_dir"),
    [("prompt-ft", "gemma_dir"), ("retroprompt", "causal_dir")],  # frozen by default
)
def test_freeze_embeddings_trains_every_weight_but_the_token_embedding_table(
    spec: str, model_dir: str, toy, request: pytest.FixtureRequest
) -> None:
    backbone = load_backbone(BackboneConfig(name=str(request.getfixturevalue(model_dir)), max_length=48))
    model = backbone.model
    table = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is table  # the tiny Gemma's head is its table; Llama's not
    assert tied == (model_dir == "gemma_dir")
    before = [(p, p.detach().clone()) for p in model.parameters()]
    method = build_method(spec)
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    trainable = method.trainable_parameters(classifier)
    everything = build_method(f"{spec}/no-freeze-embeddings").trainable_parameters(classifier)
    assert {id(p) for p in everything} - {id(p) for p in trainable} == {id(table)}
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, QUICK, progress=False)
    unchanged = [p for p, old in before if torch.equal(p, old)]
    assert [id(p) for p in unchanged] == [id(table)]  # every other weight moved, an untied head too
    assert table.requires_grad  # the flag restored after training
