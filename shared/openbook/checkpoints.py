"""A trained classifier on disk and back.

`save_classifier` writes what the method trained, the re-embedded store and a
manifest that says how to rebuild everything around them (method and config,
backbone and the hash of its base weights, template, label words, the fixed
label log-prior, the kNN and demonstration settings and the confidence
temperature chosen on dev, the sentence reader's description (its top layers go
with the weights), a hash of the training data, dev metrics, and the dev scores
behind them for the version's quality report). `load_classifier` verifies every file's
sha256 before reading it and refuses a backbone whose base weights differ, so
a loaded classifier predicts exactly as the trained one did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from openbook.artifacts import MANIFEST_NAME, CheckpointError, load_checkpoint, write_checkpoint
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.data import Example
from openbook.demonstrations import DemoConfig
from openbook.devices import default_device, require_device, resolve_device
from openbook.knn import KnnConfig
from openbook.methods import METHODS, Method, MethodError, weights_sha256
from openbook.prompting import Template, Verbalizer
from openbook.sentence_reader import SentenceReader, reader_config_of, shared_encoder
from openbook.train_config import TrainConfig
from openbook.version import __version__

READER_PREFIX = "reader."  # the sentence reader's tensors in a checkpoint's weights file


def examples_sha256(examples: Sequence[Example]) -> str:
    """Identifies a training set: sha256 of its (text, label) pairs in order."""
    rows = [[e.text if isinstance(e.text, str) else list(e.text), e.label] for e in examples]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def save_classifier(
    path: str | Path,
    classifier: Classifier,
    method: Method,
    *,
    base_weights_sha256: str,
    train_config: TrainConfig,
    training_data_sha256: str,
    dev_metrics: dict[str, Any],
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,  # more manifest entries, e.g. the log offset a service trained to
) -> Path:
    if classifier.knn.lam is None:  # what serves a checkpoint is fixed: a trained classifier's λ is a number
        raise ValueError(
            "a checkpoint keeps a lambda, not one chosen on the store: it is chosen on dev (fitting)"
        )
    backbone = classifier.backbone
    manifest = {
        "openbook_version": __version__,
        "method": method.name,
        "spec": method.spec,
        "method_config": dataclasses.asdict(method.config),
        "inference": method.inference,
        "train_config": dataclasses.asdict(train_config),
        "backbone": {
            "name": backbone.config.name,
            "kind": backbone.kind,
            "layer": backbone.config.layer,
            "max_length": backbone.config.max_length,
            # the dtype the base hash was taken in: loading in another one would fail the check
            "dtype": str(backbone.dtype).removeprefix("torch."),
            "weights_sha256": base_weights_sha256,
        },
        "template": classifier.template.source,
        "labels": list(classifier.verbalizer.labels),
        "label_words": list(classifier.verbalizer.words),
        "label_bias": None if classifier.label_bias is None else classifier.label_bias.tolist(),
        "knn": dataclasses.asdict(classifier.knn),
        "confidence_temperature": classifier.confidence_temperature,
        "demos": None if classifier.demos is None else dataclasses.asdict(classifier.demos),
        "label_scoring": classifier.label_scoring,
        "reader": None if classifier.reader is None else classifier.reader.description(),
        "min_similarity": classifier.min_similarity,
        "training_data_sha256": training_data_sha256,
        "dev_metrics": dev_metrics,
        **(extra or {}),
    }
    return write_checkpoint(
        path,
        tensors={**method.checkpoint_tensors(classifier), **reader_tensors(classifier)},
        store=classifier.store,
        manifest=manifest,
        overwrite=overwrite,
    )


def reader_tensors(classifier: Classifier) -> dict[str, torch.Tensor]:
    """The sentence reader's own top layers (packed: `split_encoder.pack_state`), under `READER_PREFIX`;
    none where it is untuned."""
    if classifier.reader is None:
        return {}
    return {READER_PREFIX + key: tensor for key, tensor in classifier.reader.state_dict().items()}


def _reader_of(
    manifest: dict[str, Any], tensors: dict[str, torch.Tensor], device: str
) -> SentenceReader | None:
    """The sentence reader a manifest describes, on the process's shared base (`shared_encoder`)."""
    description = manifest.get("reader")
    if description is None:
        return None
    layers = {
        key.removeprefix(READER_PREFIX): t for key, t in tensors.items() if key.startswith(READER_PREFIX)
    }
    base = shared_encoder(reader_config_of(description), device)
    try:
        return SentenceReader.restore(description, layers or None, base, "the checkpoint's reader")
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def method_of(manifest: dict[str, Any]) -> Method:
    """The configured method a manifest names (KeyError, TypeError or MethodError if it cannot say)."""
    method_class = METHODS[manifest["method"]]
    return method_class(method_class.config_class(**manifest["method_config"]))


def loads_onto(path: str | Path, backbone: Backbone) -> bool:
    """Whether the checkpoint at `path` loads onto `backbone`, leaving it unchanged for other tasks to share.

    Its method must keep the backbone frozen, and it must have been trained on this backbone as
    loaded here (name, kind, slot layer, max length, dtype); the base weights are checked on loading.
    """
    try:
        manifest = json.loads((Path(path) / MANIFEST_NAME).read_text())
        spec = manifest["backbone"]
        trained_on = (
            spec["name"],
            spec["kind"],
            spec["layer"],
            spec["max_length"],
            spec["dtype"],
        )
        method = method_of(manifest)
    except (OSError, ValueError, KeyError, TypeError):  # MethodError is a ValueError
        return False  # loading it on its own reports what is wrong
    config = backbone.config
    here = (
        config.name,
        backbone.kind,
        config.layer,
        config.max_length,
        str(backbone.dtype).removeprefix("torch."),
    )
    return trained_on == here and not method.updates_backbone


def load_classifier(
    path: str | Path, *, device: str | None = None, backbone: Backbone | None = None
) -> tuple[Classifier, Method]:
    """The classifier a checkpoint holds, and its method. `backbone` must carry the base weights.

    Tensors go to `device`, else to the given backbone's device, else to `$OPENBOOK_DEVICE` (cpu).
    """
    if device is None:
        device = str(backbone.device) if backbone is not None else default_device()
    device = resolve_device(device)
    require_device(device)
    checkpoint = load_checkpoint(path, device=device)
    manifest = checkpoint.manifest
    try:
        method = method_of(manifest)
        spec = manifest["backbone"]
        if backbone is None:
            backbone = load_backbone(
                BackboneConfig(
                    name=spec["name"],
                    layer=spec["layer"],
                    max_length=spec["max_length"],
                    device=device,
                    kind=spec["kind"],
                    dtype=spec["dtype"],
                )
            )
        if weights_sha256(backbone.model) != spec["weights_sha256"]:
            raise CheckpointError(
                f"{path}: the backbone's weights are not the ones this checkpoint was trained from "
                f"({spec['name']}, weights sha256 {spec['weights_sha256'][:12]}…)"
            )
        bias = manifest["label_bias"]
        reader = _reader_of(manifest, checkpoint.tensors, device)
        classifier = Classifier(
            backbone,
            Template(manifest["template"]),
            Verbalizer(tuple(manifest["labels"]), tuple(manifest["label_words"])),
            store=checkpoint.store,
            knn=KnnConfig(**manifest["knn"]),
            demos=None if manifest["demos"] is None else DemoConfig(**manifest["demos"]),
            label_bias=None if bias is None else np.asarray(bias, dtype=np.float32),
            confidence_temperature=float(manifest["confidence_temperature"]),
            label_scoring=manifest["label_scoring"],
            reader=reader,
            min_similarity=manifest.get("min_similarity"),  # absent from checkpoints saved before it
        )
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: manifest is missing or has a malformed entry: {error}") from None
    except MethodError as error:
        raise CheckpointError(f"{path}: {error}") from None
    classifier = method.prepare(classifier)  # e.g. builds the soft prompt that the tensors fill
    method.load_trained(
        classifier, {key: t for key, t in checkpoint.tensors.items() if not key.startswith(READER_PREFIX)}
    )
    classifier.backbone.model.eval()
    if classifier.prompt is not None:
        classifier.prompt.eval()
    return classifier, method
