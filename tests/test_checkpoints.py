"""A trained classifier on disk and back (`checkpoints.py`); the file format is tests/test_artifacts.py.

The round trip to identical predictions runs for every method in its own test module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from openbook.artifacts import CheckpointError
from openbook.backbone import BackboneConfig, load_backbone
from openbook.checkpoints import examples_sha256, load_classifier, save_classifier
from openbook.data import Example
from openbook.training import TrainConfig, train

CONFIG = TrainConfig(steps=2, batch_size=4, lr=3e-3, eval_every=6, patience=10, warmup_ratio=0.0)


def test_checkpoint_refuses_other_base_weights(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    path = save_classifier(
        tmp_path / "ckpt",
        classifier,
        method,
        base_weights_sha256="f" * 64,
        train_config=CONFIG,
        training_data_sha256="0" * 64,
        dev_metrics={},
    )
    with pytest.raises(CheckpointError, match="not the ones this checkpoint was trained from"):
        load_classifier(path, backbone=load_backbone(BackboneConfig(name=str(causal_dir))))


def test_examples_sha256_identifies_texts_labels_and_their_order() -> None:
    examples = [Example("a good film", "1", "x:1"), Example(("a", "pair"), "0", "x:2")]
    digest = examples_sha256(examples)
    assert len(digest) == 64 and digest == examples_sha256(list(examples))
    # Where an example came from is not part of the data.
    assert examples_sha256([dataclasses.replace(e, source="elsewhere") for e in examples]) == digest
    changed = [
        examples[::-1],
        [dataclasses.replace(examples[0], label="0"), examples[1]],
        [dataclasses.replace(examples[0], text="a good film."), examples[1]],
        [examples[0], dataclasses.replace(examples[1], text=("a", "pair."))],
    ]
    assert len({digest, *(examples_sha256(other) for other in changed)}) == 1 + len(changed)


def test_only_a_frozen_backbone_checkpoint_of_the_same_backbone_loads_onto_a_shared_one(
    causal_dir: Path, tmp_path: Path, toy
) -> None:
    from openbook.checkpoints import loads_onto
    from openbook.classifier import Classifier
    from openbook.methods import build_method, weights_sha256

    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    shorter = load_backbone(BackboneConfig(name=str(causal_dir), max_length=32))
    paths = {}
    for spec in ("lora", "prompt-tuning", "prompt-ft"):
        method = build_method(spec)
        classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
        paths[spec] = save_classifier(
            tmp_path / spec.replace("/", "-"),
            classifier,
            method,
            base_weights_sha256=weights_sha256(backbone.model),
            train_config=TrainConfig(),
            training_data_sha256="0" * 64,
            dev_metrics={},
        )
    assert loads_onto(paths["lora"], backbone) and loads_onto(paths["prompt-tuning"], backbone)
    assert not loads_onto(paths["prompt-ft"], backbone)  # it changed the weights: a copy of its own
    assert not loads_onto(paths["lora"], shorter)  # trained at another max_length
    assert not loads_onto(tmp_path / "nothing", backbone)
