"""LoRA adapters (`methods/lora.py`): `lora` and `retroprompt/backbone=lora` on tiny random backbones."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.checkpoints import load_classifier, save_classifier
from openbook.classifier import Classifier
from openbook.methods import MethodError, TrainBatch, build_method, weights_sha256
from openbook.train_config import TrainConfig
from openbook.training import reembed, train

CONFIG = TrainConfig(steps=24, batch_size=4, eval_every=8, patience=5, warmup_ratio=0.0, calibration="none")
SPECS = ["lora/lora-lr=0.01", "retroprompt/backbone=lora/lora-lr=0.01"]


def full_batch_loss(classifier: Classifier, method, toy) -> float:
    classifier.backbone.model.eval()
    batch = TrainBatch(toy.texts, torch.tensor(toy.labels), np.arange(len(toy.texts)))
    with torch.no_grad():
        return float(method.loss(classifier, batch))


def trained(backbone: Backbone, spec: str, toy, *, flip: bool = False):
    """A classifier trained with `spec` on `backbone` (the toy labels swapped with `flip`), and its method."""
    method = build_method(spec)
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    labels = 1 - toy.labels if flip else toy.labels
    result = train(classifier, method, toy.texts, labels, toy.texts, labels, CONFIG, progress=False)
    return classifier, method, result


def save(classifier, method, result, path: Path, base_sha: str) -> Path:
    return save_classifier(
        path,
        classifier,
        method,
        base_weights_sha256=base_sha,
        train_config=CONFIG,
        training_data_sha256="0" * 64,
        dev_metrics={"accuracy": result.best.accuracy},
    )


def fresh(model_dir: Path) -> Backbone:
    return load_backbone(BackboneConfig(name=str(model_dir), max_length=48))


@pytest.mark.parametrize("spec", SPECS)
def test_adapters_learn_save_alone_and_load_back_to_the_same_predictions(
    spec: str, sharp_dir: Path, tmp_path: Path, toy
) -> None:
    backbone = fresh(sharp_dir)
    base_sha = weights_sha256(backbone.model)
    method = build_method(spec)
    untrained = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    reembed(untrained, toy.texts, toy.labels)  # retroprompt's loss reads the store
    loss_before = full_batch_loss(untrained, method, toy)

    classifier, method, result = trained(backbone, spec, toy)
    assert full_batch_loss(classifier, method, toy) < 0.9 * loss_before
    assert weights_sha256(backbone.model) == base_sha  # the adapters trained, the base did not

    path = save(classifier, method, result, tmp_path / "ckpt", base_sha)
    adapter_bytes = sum(t.numel() * t.element_size() for t in method.trained_tensors(classifier).values())
    base_bytes = sum(t.numel() * t.element_size() for t in backbone.model.state_dict().values())
    weights_file = next(path.glob("*.safetensors")).stat().st_size
    assert adapter_bytes < weights_file < adapter_bytes + 16_384  # the adapters and a header, nothing else
    assert weights_file < base_bytes / 10

    shared = fresh(sharp_dir)
    loaded, loaded_method = load_classifier(path, backbone=shared)
    assert loaded_method.spec == method.spec and not loaded_method.updates_backbone
    for a, b in zip(loaded.predict(toy.texts), classifier.predict(toy.texts), strict=True):
        assert a.probabilities == b.probabilities
    assert weights_sha256(shared.model) == base_sha


def test_two_tasks_on_one_backbone_each_predict_as_alone(causal_dir: Path, tmp_path: Path, toy) -> None:
    backbone = fresh(causal_dir)
    base_sha = weights_sha256(backbone.model)
    paths = []
    for flip in (False, True):  # two tasks with opposite labels: their adapters must pull apart
        classifier, method, result = trained(backbone, SPECS[0], toy, flip=flip)
        paths.append(save(classifier, method, result, tmp_path / f"task{int(flip)}", base_sha))
    alone = [load_classifier(path, backbone=fresh(causal_dir))[0].predict(toy.texts) for path in paths]
    assert [p.label for p in alone[0]] != [p.label for p in alone[1]]

    shared = fresh(causal_dir)
    tasks = [load_classifier(path, backbone=shared)[0] for path in paths]
    embeddings = [t.backbone.input_embeddings.weight for t in tasks]
    assert embeddings[0].data_ptr() == embeddings[1].data_ptr() == shared.input_embeddings.weight.data_ptr()
    got: dict[int, list] = {}

    def serve(i: int) -> None:  # both tasks at once, as an api replica's threads would
        for _ in range(5):
            got[i] = tasks[i].predict(toy.texts)

    threads = [threading.Thread(target=serve, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in (0, 1):
        for a, b in zip(got[i], alone[i], strict=True):
            assert a.probabilities == pytest.approx(b.probabilities, abs=1e-6)
    assert weights_sha256(shared.model) == base_sha


def test_default_targets_follow_the_architecture(backbone: Backbone, toy) -> None:
    method = build_method("lora")
    classifier = method.prepare(Classifier(backbone, toy.template, toy.verbalizer))
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in method.trained_tensors(classifier)}
    assert adapted == ({"q_proj", "v_proj"} if backbone.kind == "causal" else {"query", "value"})


def test_options_are_checked(causal_backbone: Backbone, albert_dir: Path, toy) -> None:
    for spec, match in [
        ("lora/r=0", "r must be at least 1"),
        ("lora/dropout=1.0", "dropout"),
        ("lora/targets=q_proj;v_proj", "comma-separated"),
        ("lora/lora-lr=0", "lora_lr"),
        ("retroprompt/r=4", "backbone=lora"),
        ("retroprompt/backbone=adapter", "backbone must be one of"),
    ]:
        with pytest.raises(MethodError, match=match):
            build_method(spec)
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    with pytest.raises(MethodError, match="not linear layers"):
        build_method("lora/targets=q_proj,query").prepare(classifier)
    with pytest.raises(MethodError, match="no default LoRA targets for 'albert'"):
        build_method("lora").prepare(Classifier(fresh(albert_dir), toy.template, toy.verbalizer))
    every = build_method("lora/targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    adapted = every.prepare(classifier)
    assert len(every.trained_tensors(adapted)) == 2 * 7 * causal_backbone.model.config.num_hidden_layers
