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
from openbook.train_config import TrainConfig
from openbook.training import train

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


# Half-precision checkpoints of full fine-tuning, reloaded into float32: what the round trip may move
# (the tiny models move at most 2.2e-4).
HALF_PROBABILITY_ATOL = 1e-3


@pytest.mark.parametrize(
    "spec",
    [
        "prompt-ft",
        "retroprompt",
        "dart",
        "prompt-ft/no-freeze-embeddings",
        "retroprompt/no-freeze-embeddings",
    ],
)
def test_full_fine_tuning_is_saved_in_float16_and_reloads_close_to_float32(
    model_dir: Path, spec: str, tmp_path: Path, toy, corpus, fresh_classifier
) -> None:
    import numpy as np
    import torch
    from openbook.artifacts import WEIGHTS_NAME, load_checkpoint
    from openbook.methods import weights_sha256

    classifier, method = fresh_classifier(model_dir, spec)
    base_sha = weights_sha256(classifier.backbone.model)
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    path = save_classifier(
        tmp_path / "ckpt",
        classifier,
        method,
        base_weights_sha256=base_sha,
        train_config=CONFIG,
        training_data_sha256="0" * 64,
        dev_metrics={},
    )
    saved = load_checkpoint(path).tensors  # the sha256 of every file still verified
    assert {tensor.dtype for tensor in saved.values()} == {torch.float16}
    model = classifier.backbone.model
    table = model.get_input_embeddings().weight
    names = {name for name, t in model.state_dict().items() if t.data_ptr() == table.data_ptr()}
    trains_table = spec == "dart" or spec.endswith("no-freeze-embeddings")
    assert bool(names & saved.keys()) == trains_table  # a frozen table is the base's: not stored
    full = sum(t.numel() * t.element_size() for t in method.trained_tensors(classifier).values())
    assert 0.45 * full < (path / WEIGHTS_NAME).stat().st_size < 0.55 * full  # about half of float32

    backbone = load_backbone(BackboneConfig(name=str(model_dir), max_length=48))
    loaded, _ = load_classifier(path, backbone=backbone)
    assert loaded.backbone.model.dtype == torch.float32  # back in the model's own dtype
    # What the weights' round trip moves, with neighbours by plain cosine: centred scoring magnifies any
    # precision's noise on a small store, as test_backbone_dtype.py bounds for bfloat16.
    classifier.knn = loaded.knn = dataclasses.replace(loaded.knn, similarity="cosine")
    texts = [*toy.texts, *corpus[:16]]
    before = np.array([list(p.probabilities.values()) for p in classifier.predict(texts)])
    after = np.array([list(p.probabilities.values()) for p in loaded.predict(texts)])
    assert np.abs(after - before).max() <= HALF_PROBABILITY_ATOL
    assert (after.argmax(1) == before.argmax(1)).all()


def test_half_precision_keeps_other_dtypes_and_falls_back_to_bfloat16_out_of_range() -> None:
    import torch
    from openbook.methods.base import half_precision

    halved = half_precision(
        {
            "w": torch.ones(3),
            "big": torch.tensor([1e6, 1.0]),
            "step": torch.tensor([3]),
            "b": torch.ones(2, dtype=torch.bfloat16),
        }
    )
    assert halved["w"].dtype == torch.float16 and halved["big"].dtype == torch.bfloat16
    assert halved["step"].dtype == torch.int64 and halved["b"].dtype == torch.bfloat16
    assert halved["big"][0].item() == pytest.approx(1e6, rel=1e-2)


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


def test_a_checkpoint_keeps_how_its_store_scores_neighbours_and_its_labels(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    import json

    from openbook.knn import KnnConfig
    from openbook.methods import weights_sha256

    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    base_sha = weights_sha256(classifier.backbone.model)
    train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    classifier.knn = KnnConfig(8, 1.0, 0.3, similarity="centred", standardise=True)
    classifier.label_scoring = "vectors"
    record = {"train_config": CONFIG, "training_data_sha256": "0" * 64, "dev_metrics": {}}
    path = save_classifier(tmp_path / "ckpt", classifier, method, base_weights_sha256=base_sha, **record)
    loaded, _ = load_classifier(path)
    assert loaded.knn == classifier.knn and loaded.label_scoring == "vectors"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["knn"] == {
        "k": 8,
        "temperature": 1.0,
        "lam": 0.3,
        "similarity": "centred",
        "standardise": True,
    }
