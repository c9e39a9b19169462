"""Build, fit, save and load a classifier in three calls, labels as strings, as the service trains one.

    clf = openbook.create_classifier("Review: {text}\\nSentiment: {mask}", {"0": "negative", "1": "positive"})
    report = clf.fit(texts, labels)        # a quarter held out as dev, as the service's trainer does
    clf.predict(["What a lovely film."])
    clf.save("ckpt/sentiment")             # checksums taken here; openbook.load("ckpt/sentiment")

`Estimator.fit` and `.save` are the library's one fit pipeline (`fitting.py`), and every door trains
through them: a library user, `openbook train` (cli/train.py: its k-shot dev given apart, `--init` a
loaded checkpoint trained on) and the service's trainer (services/trainer/worker.py: a job's progress,
stage and cancellation through `on_step`/`on_stage`, its task, version and log offset in the manifest).
`create_classifier` builds the untrained classifier a service task starts from
(`untrained.build_classifier`). The classifier it wraps is `.classifier`, for everything else the library
does (neighbours, demonstrations, reports); `training.train` stays the research entry point.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openbook.artifacts import MANIFEST_NAME, CheckpointError
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.checkpoints import load_classifier
from openbook.classifier import Classifier
from openbook.dev_split import DEV_FRACTION
from openbook.devices import default_device
from openbook.encoders import chosen_reader
from openbook.fitting import FitSets, TrainingRecord, fit_classifier, save_fitted, scored_from_record
from openbook.methods import DEFAULT_METHOD, Method, build_method, weights_sha256
from openbook.models import default_backbone
from openbook.predictions import Prediction
from openbook.prompting import Template, TextInput, Verbalizer
from openbook.quality import Scored
from openbook.sentence_reader import ReaderConfig, untuned_reader
from openbook.train_config import TrainConfig
from openbook.training import TrainResult
from openbook.untrained import build_classifier
from openbook.word_scores import LabelScoringChoice


@dataclass(frozen=True)
class FitReport:
    dev_accuracy: float  # the prediction as served (kNN interpolation included where the method mixes it)
    dev_metrics: dict[str, Any]  # as the checkpoint records them (fitting.fit_classifier)
    train_ids: list[int]
    dev_ids: list[int]  # empty: too few examples for dev, and the train examples stood in for it
    result: TrainResult
    dev_scores: Scored | None  # dev as the classifier serves it, before calibration (None: under 2 dev)


@dataclass
class Estimator:
    """A classifier and the method that trains it; `record` is None until it is trained."""

    classifier: Classifier
    method: Method
    record: TrainingRecord | None = None
    dev_scored_on: str | None = None  # "dev", or "train" when no example could be held out
    # The sha256 of the base weights its backbone was loaded with, where they are not its weights now: a
    # classifier loaded from a checkpoint to train on (`openbook train --init`). None: its backbone's own.
    base_weights_sha256: str | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return self.classifier.labels

    def fit(
        self,
        texts: Sequence[TextInput],
        labels: Sequence[str],
        *,
        ids: Sequence[int] | None = None,
        dev: float | tuple[Sequence[TextInput], Sequence[str]] = DEV_FRACTION,
        dev_ids: Sequence[int] | None = None,
        seed: int = TrainConfig.seed,
        steps: int | None = None,
        epochs: float | None = None,
        progress: bool = False,
        on_step: Callable[[int, int, float], None] | None = None,
        on_stage: Callable[[str], None] | None = None,
        **train_options: Any,
    ) -> FitReport:
        """Train on labelled examples (label strings) and choose how to predict on dev, as a service job.

        Dev is `dev`, a share of the examples held out by a hash of their ids (`ids`, default their
        positions) exactly as the service's trainer holds it out, or dev examples given apart as
        (texts, labels) (under `dev_ids`, default their positions), as `openbook train` gives its k-shot
        dev. The trained classifier's store holds every example of `texts`, a dev held out of them
        included, a dev given apart not. The budget is `steps` or `epochs`, neither for the service's
        default; `train_options` are `TrainConfig`'s other fields. `on_step(step, steps, loss)` and
        `on_stage(stage)` report progress (`training.TRAIN_STAGES`); an exception either raises stops
        training there and comes out of `fit`, the classifier part-trained (a cancelled job's way out).

        A method that trains the backbone changes its weights in place (a backbone given to
        `create_classifier` too); a classifier trains once (`openbook train --init` trains a loaded one
        on: `Estimator(loaded.classifier, method, base_weights_sha256=...)`).
        """
        if self.record is not None:
            raise ValueError("this classifier is trained already: create a new one to train again")
        examples = _examples(texts, labels, ids)
        split: float | dict[int, tuple[TextInput, str]] = (
            float(dev) if isinstance(dev, float | int) else _examples(*dev, dev_ids)
        )
        seen = sorted({label for _, label in examples.values()})
        if len(seen) < 2:
            raise ValueError(
                f"the training data has fewer than 2 classes (labels seen: {seen}): "
                "training needs examples of at least 2 labels"
            )
        dev_labels = [] if isinstance(split, float) else [label for _, label in split.values()]
        self.classifier.label_indices([*labels, *dev_labels])  # an unknown label fails before any forward
        config = TrainConfig(steps=steps, epochs=epochs, seed=seed, **train_options)
        budget: dict[str, Any] = config.budget()
        config = dataclasses.replace(config, **budget)  # written as it runs, as a service job's is
        base_sha = self.base_weights_sha256 or weights_sha256(self.classifier.backbone.model)
        untrained = self.classifier  # its base weights' sha taken above, before training changes them
        classifier = self.method.prepare(
            dataclasses.replace(untrained, store=untrained.empty_store(), label_bias=None)
        )
        sets = FitSets.of(classifier, examples, split)
        dev_metrics, result, dev_scores = fit_classifier(
            classifier, self.method, sets, config, progress=progress, on_step=on_step, on_stage=on_stage
        )
        self.classifier = classifier
        self.record = TrainingRecord(base_sha, sets.training_data_sha256(), config, dev_metrics, dev_scores)
        self.dev_scored_on = sets.dev_scored_on()
        served = dev_metrics.get("accuracy_with_knn", dev_metrics["accuracy"])
        train_ids = sets.train.example_ids().tolist()
        return FitReport(served, dev_metrics, train_ids, sets.dev_ids(), result, dev_scores)

    def predict(self, texts: Sequence[TextInput]) -> list[Prediction]:
        return self.classifier.predict(texts)

    def predict_proba(self, texts: Sequence[TextInput]) -> np.ndarray:
        """(N, C) probabilities, columns in `labels` order."""
        predictions = self.classifier.predict(texts)
        return np.array([[p.probabilities[label] for label in self.labels] for p in predictions])

    def save(
        self, path: str | Path, *, overwrite: bool = False, extra: Mapping[str, Any] | None = None
    ) -> Path:
        """Write the trained classifier as a checkpoint (`openbook.load`, `openbook classify --checkpoint`
        and the service read it); the base weights' and the training data's checksums go with it, and
        `extra` manifest entries (a service job's task, job, version and log offset)."""
        if self.record is None:
            raise ValueError("nothing trained to save: call fit first")
        entries = {
            **(extra or {}),
            **({} if self.dev_scored_on is None else {"dev_scored_on": self.dev_scored_on}),
        }
        return save_fitted(
            path, self.classifier, self.method, self.record, extra=entries, overwrite=overwrite
        )


def _examples(
    texts: Sequence[TextInput], labels: Sequence[str], ids: Sequence[int] | None
) -> dict[int, tuple[TextInput, str]]:
    """id -> (text, label), ids by default the positions; ValueError for unequal lengths or repeated ids."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    ids = list(range(len(texts))) if ids is None else [int(i) for i in ids]
    if len(set(ids)) != len(texts):
        raise ValueError(f"give one distinct id per text: {len(texts)} texts, {len(set(ids))} ids")
    return dict(zip(ids, zip(texts, labels, strict=True), strict=True))


def create_classifier(
    template: str | Template,
    labels: Mapping[str, str] | Sequence[str] | Verbalizer,
    *,
    backbone: str | Backbone | None = None,
    method: str | Method = DEFAULT_METHOD,
    device: str | None = None,
    label_scoring: LabelScoringChoice = "auto",
    reader: str | ReaderConfig | None = None,
) -> Estimator:
    """An untrained classifier, as a new service task starts: `labels` as label -> word, or label names
    alone (each scored by its readable word, book_flight -> "book flight"); `backbone` a registered name,
    a local model directory or hub id, or a loaded Backbone (default `$OPENBOOK_DEFAULT_BACKBONE`, else
    gemma3-270m); `method` a spec (`retroprompt/knn-loss`); `label_scoring` "exact", "vectors" (one
    product for all labels, cheaper with many labels of long words: `word_scores.py`) or "auto" (exact up
    to 16 labels, vectors above); `reader` the sentence encoder that keys the book, by its registered
    name or folder, or a `ReaderConfig` (default `$OPENBOOK_DEFAULT_READER`, else "mpnet"; "none": the
    slot vectors key it): P_kNN reads its neighbours, and `fit` tunes it on the examples
    (`sentence_reader.py`; tasks of a process share its base, `shared_encoder`).
    Before `fit` it predicts from the prompt, and from its store once examples are added."""
    method = build_method(method) if isinstance(method, str) else method
    backbone = default_backbone() if backbone is None else backbone
    if isinstance(backbone, str):
        config = BackboneConfig(name=backbone, device=device or default_device())
        backbone = load_backbone(config)
    method.check_backbone(backbone)
    reader = chosen_reader(reader)
    sentence_reader = None if reader is None else untuned_reader(reader, str(backbone.device))
    classifier = build_classifier(
        backbone, template, labels, label_scoring=label_scoring, reader=sentence_reader
    )
    return Estimator(classifier, method)


def load(path: str | Path, *, device: str | None = None, backbone: Backbone | None = None) -> Estimator:
    """A saved classifier, every file's checksum verified (`checkpoints.load_classifier`); `backbone`, if
    given, must carry the base weights it was trained from."""
    classifier, method = load_classifier(path, device=device, backbone=backbone)
    manifest = json.loads((Path(path) / MANIFEST_NAME).read_text())
    try:
        saved = manifest["train_config"]
        record = TrainingRecord(
            manifest["backbone"]["weights_sha256"],
            manifest["training_data_sha256"],
            TrainConfig(
                **{f.name: saved[f.name] for f in dataclasses.fields(TrainConfig) if f.name in saved}
            ),
            manifest["dev_metrics"],
            None if manifest.get("dev_scores") is None else scored_from_record(manifest["dev_scores"]),
        )
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: manifest is missing or has a malformed entry: {error}") from None
    return Estimator(classifier, method, record, manifest.get("dev_scored_on"))
