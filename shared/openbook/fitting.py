"""Train a method, decide how the trained classifier predicts, and save it: one path for every caller.

`openbook train` and the service's trainer worker both run this sequence:

1. `training.train` (the kept weights are the best on dev);
2. how the classifier predicts: a method that interpolates with kNN gets its
   k, T and lambda chosen on dev alone (`selection.py`: the training examples
   are no evidence once the prompt has been fitted to them), any other
   predicts from the prompt alone (lambda = 0);
2b. its confidence: dev is scored as it will serve (with a store of the
   training examples), and temperature scaling is adopted if it lowers the
   cross-validated ECE on dev (`quality.calibrate`); those dev scores are kept
   with the checkpoint, for the version's quality report;
3. optionally, the store rebuilt from other examples with the trained weights
   (the worker stores every example under its log id, dev included);
4. `checkpoints.save_classifier`, atomically.

`fit_classifier` stops before step 4, for a caller that only scores the result (the baselines of
`openbook bench learning-curve`) or saves it later (`estimator.Estimator`: `save_fitted` is step 4).

`FitSets` is what the service's worker and `Estimator.fit` train on, from labelled examples under ids:
dev held out by `dev_split.split_dev`, and every example, dev included, in the saved store.

`dev_check` scores a trained classifier on dev as it would serve (accuracy, then the
gold label's log-likelihood: `training.DevScore`), for the service's promotion gate; a job's own
candidate is scored from the dev scores of step 2b (`served_dev_score`), so dev is scored once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from openbook.calibration import with_temperature
from openbook.checkpoints import examples_sha256, save_classifier
from openbook.classifier import Classifier, Embeddings, SlotVectors
from openbook.data import Example
from openbook.dev_split import Examples, checked_on
from openbook.methods import Method
from openbook.prompting import TextInput
from openbook.quality import Scored, calibrate, score_examples
from openbook.selection import choose_knn_on_dev
from openbook.store import KnowledgeStore
from openbook.train_config import TrainConfig
from openbook.training import DevScore, TrainResult, train


@dataclass(frozen=True)
class LabelledTexts:
    texts: Sequence[TextInput]
    labels: np.ndarray  # (N,) label indices
    ids: np.ndarray | None = None  # (N,) the examples' own ids, for reports; None: their positions

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels) or (self.ids is not None and len(self.ids) != len(self.texts)):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels (or ids)")

    def example_ids(self) -> np.ndarray:
        return np.arange(len(self.texts), dtype=np.int64) if self.ids is None else np.asarray(self.ids)


@dataclass(frozen=True)
class StoreExamples:
    """What the saved store holds instead of the training examples."""

    texts: Sequence[TextInput]
    labels: Sequence[str]
    ids: np.ndarray  # (N,) int64


@dataclass(frozen=True)
class FitSets:
    """Labelled examples under ids, split as the service trains on them (`of`)."""

    train: LabelledTexts
    dev: LabelledTexts  # what the dev checks and the choice of k, T and lambda score: `checked_on`
    store: StoreExamples  # every example, dev included, under its id: what the trained classifier serves
    dev_held_out: bool  # False: no dev example yet, and the train examples stand in for dev

    @classmethod
    def of(
        cls, classifier: Classifier, examples: Examples, train_ids: list[int], dev_ids: list[int]
    ) -> FitSets:
        """The sets for `split_dev`'s ids; label strings become `classifier`'s indices (PromptError for a
        label it does not know)."""

        def labelled(ids: list[int]) -> LabelledTexts:
            return LabelledTexts(
                [examples[i][0] for i in ids],
                classifier.label_indices([examples[i][1] for i in ids]),
                np.array(ids, dtype=np.int64),
            )

        everything = sorted(examples)
        store = StoreExamples(
            [examples[i][0] for i in everything],
            [examples[i][1] for i in everything],
            np.array(everything, dtype=np.int64),
        )
        return cls(labelled(train_ids), labelled(checked_on(train_ids, dev_ids)), store, bool(dev_ids))

    def training_data_sha256(self) -> str:
        """`checkpoints.examples_sha256` of every example (dev included), in id order."""
        return examples_sha256(
            [
                Example(text, label, f"id {i}")
                for text, label, i in zip(self.store.texts, self.store.labels, self.store.ids, strict=True)
            ]
        )

    def dev_scored_on(self) -> str:
        """What a saved version's dev scores were taken on, for its quality report."""
        return "dev" if self.dev_held_out else "train"


@dataclass(frozen=True)
class TrainingRecord:
    """What a checkpoint says of the training that made its classifier, besides the classifier itself."""

    base_weights_sha256: str  # the backbone's weights before training
    training_data_sha256: str
    train_config: TrainConfig
    dev_metrics: dict[str, Any]
    dev_scores: Scored | None


def save_fitted(
    path: str | Path,
    classifier: Classifier,
    method: Method,
    record: TrainingRecord,
    *,
    extra: dict[str, Any] | None = None,  # more manifest entries (see `save_classifier`)
    overwrite: bool = False,
) -> Path:
    """Step 4: `checkpoints.save_classifier`, with the dev scores kept for the version's report."""
    dev_scores = None if record.dev_scores is None else scores_record(record.dev_scores)
    return save_classifier(
        path,
        classifier,
        method,
        base_weights_sha256=record.base_weights_sha256,
        train_config=record.train_config,
        training_data_sha256=record.training_data_sha256,
        dev_metrics=record.dev_metrics,
        overwrite=overwrite,
        extra={**(extra or {}), "dev_scores": dev_scores},
    )


@dataclass(frozen=True)
class Fitted:
    path: Path
    dev_metrics: dict[
        str, Any
    ]  # accuracy, best_step, step_budget, steps_run[, accuracy_with_knn, calibration]
    result: TrainResult
    dev_scores: Scored | None  # dev as the classifier serves it, before calibration (quality.py)


def fit_classifier(
    classifier: Classifier,
    method: Method,
    train_set: LabelledTexts,
    dev_set: LabelledTexts,
    config: TrainConfig,
    *,
    store_examples: StoreExamples | None = None,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], TrainResult, Scored | None]:
    """Steps 1-3 without saving: train `classifier` (already `method.prepare`d) in place and choose its
    inference and confidence on dev; returns the dev metrics, the training result and the dev scores
    (None with fewer than 2 dev examples)."""
    result = train(
        classifier,
        method,
        train_set.texts,
        train_set.labels,
        dev_set.texts,
        dev_set.labels,
        config,
        progress=progress,
        on_step=on_step,
        on_stage=on_stage,
    )
    dev_metrics: dict[str, Any] = {
        "accuracy": result.best.accuracy,
        "best_step": result.best.step,
        "step_budget": result.step_budget,
        "steps_run": result.steps_run,
    }
    # dev as the trained classifier serves it, embedded once for the choice of k, T and lambda, the
    # calibration and the served store (the last dev check's embeddings, where they are these already)
    dev = result.dev_embeddings
    if dev is None and len(dev_set.texts):
        dev = classifier.embed(dev_set.texts)
    if method.inference == "knn-interp":
        classifier.knn, dev_metrics["accuracy_with_knn"] = choose_knn_on_dev(
            classifier, dev_set.texts, dev_set.labels, embedded=dev
        )
    else:
        classifier.knn = dataclasses.replace(classifier.knn, lam=0.0)  # the prompt alone
    dev_scores = None
    if len(dev_set.texts) >= 2:
        dev_metrics["calibration"], dev_scores = calibrate_on_dev(classifier, dev_set, embedded=dev)
    if store_examples is not None:
        serve_store(classifier, store_examples, train_set, dev_set, dev)
    return dev_metrics, result, dev_scores


def serve_store(
    classifier: Classifier,
    examples: StoreExamples,
    train_set: LabelledTexts,
    dev_set: LabelledTexts,
    dev: Embeddings | None,
) -> None:
    """Replace the training store (the train examples under their positions) with every example under its
    own id, as the trained classifier serves. The keys already taken under the kept weights are kept: the
    training store's, and dev's (`dev`); only the examples in neither are embedded."""
    known: dict[int, tuple[TextInput, np.ndarray]] = {}
    train_keys = classifier.store.vectors_of(np.arange(len(train_set.texts), dtype=np.int64))
    known.update(
        zip(train_set.example_ids().tolist(), zip(train_set.texts, train_keys, strict=True), strict=True)
    )
    if dev is not None:
        known.update(
            zip(dev_set.example_ids().tolist(), zip(dev_set.texts, dev.vectors, strict=True), strict=True)
        )
    ids = np.asarray(examples.ids, dtype=np.int64)
    vectors = np.zeros((len(ids), classifier.backbone.hidden_size), dtype=np.float32)
    missing = []
    for row, (example_id, text) in enumerate(zip(ids.tolist(), examples.texts, strict=True)):
        if example_id in known and known[example_id][0] == text:
            vectors[row] = known[example_id][1]
        else:
            missing.append(row)
    if missing:
        vectors[missing] = classifier.embed_vectors([examples.texts[row] for row in missing]).vectors
    classifier.store = KnowledgeStore(classifier.backbone.hidden_size, device=classifier.backbone.device)
    classifier.add_embeddings(
        SlotVectors(vectors, np.zeros(len(ids), dtype=bool)), examples.labels, ids, texts=examples.texts
    )


def calibrate_on_dev(
    classifier: Classifier, dev_set: LabelledTexts, *, embedded: Embeddings | None = None
) -> tuple[dict[str, Any], Scored]:
    """Score dev as the classifier serves (its store holds the training examples), and adopt temperature
    scaling if it lowers the cross-validated ECE (`quality.calibrate`). Returns the calibration's record
    and the dev scores before it (T = 1), which the checkpoint keeps for the version's report. `embedded`:
    dev's embeddings under the classifier as it stands, when already taken."""
    classifier.confidence_temperature = 1.0
    scored = score_examples(
        classifier, dev_set.texts, _label_names(classifier, dev_set), dev_set.example_ids(), embedded=embedded
    )
    calibration = calibrate(scored)
    classifier.confidence_temperature = calibration.temperature
    return {key: round(v, 6) if isinstance(v, float) else v for key, v in vars(calibration).items()}, scored


def scores_record(scored: Scored) -> dict[str, list]:
    """Scored examples as JSON keeps them (probabilities to 6 decimals); `scored_from_record` reads them."""
    return {
        "ids": scored.ids.tolist(),
        "gold": scored.gold.tolist(),
        "probabilities": np.round(scored.probabilities.astype(np.float64), 6).tolist(),
    }


def scored_from_record(record: dict[str, list]) -> Scored:
    return Scored(
        np.asarray(record["ids"], dtype=np.int64),
        np.asarray(record["gold"], dtype=np.int64),
        np.asarray(record["probabilities"], dtype=np.float64).reshape(len(record["ids"]), -1),
    )


def _label_names(classifier: Classifier, texts: LabelledTexts) -> list[str]:
    return [classifier.labels[int(i)] for i in texts.labels]


def fit_and_save(
    path: str | Path,
    classifier: Classifier,
    method: Method,
    train_set: LabelledTexts,
    dev_set: LabelledTexts,
    config: TrainConfig,
    *,
    base_weights_sha256: str,
    training_data_sha256: str,
    store_examples: StoreExamples | None = None,
    extra: dict[str, Any] | None = None,  # more manifest entries (see `save_classifier`)
    overwrite: bool = False,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Fitted:
    """Train `classifier` (already `method.prepare`d) in place, choose its inference on dev, save it."""
    dev_metrics, result, dev_scores = fit_classifier(
        classifier,
        method,
        train_set,
        dev_set,
        config,
        store_examples=store_examples,
        progress=progress,
        on_step=on_step,
        on_stage=on_stage,
    )
    record = TrainingRecord(base_weights_sha256, training_data_sha256, config, dev_metrics, dev_scores)
    saved = save_fitted(path, classifier, method, record, extra=extra, overwrite=overwrite)
    return Fitted(saved, dev_metrics, result, dev_scores)


def dev_check(classifier: Classifier, train: StoreExamples, dev: LabelledTexts) -> DevScore | None:
    """The final prediction (kNN interpolation included) scored on dev; None with no dev example.

    The classifier predicts with a store of the train examples alone, embedded by its own weights, so no
    dev example is its own neighbour. The classifier itself is left as it was. `fit_classifier` scores
    dev this way too (its `Scored` dev scores): `served_dev_score` reads a job's score from them.
    """
    if len(dev.texts) == 0:
        return None
    store = KnowledgeStore(classifier.backbone.hidden_size, device=classifier.backbone.device)
    scoring = dataclasses.replace(classifier, store=store)
    scoring.add_examples(train.texts, train.labels, ids=train.ids)
    scored = score_examples(scoring, dev.texts, _label_names(scoring, dev), dev.example_ids())
    return DevScore.of(scored.probabilities, scored.gold)


def served_dev_score(dev_scores: Scored, temperature: float) -> DevScore:
    """`dev_check`'s score, from the dev scores `fit_classifier` took before calibration (T = 1) and the
    confidence temperature it then adopted: the same distributions, without scoring dev again."""
    return DevScore.of(with_temperature(dev_scores.probabilities, temperature), dev_scores.gold)


def dev_accuracy(classifier: Classifier, train: StoreExamples, dev: LabelledTexts) -> float | None:
    """`dev_check`'s accuracy; None with no dev example."""
    check = dev_check(classifier, train, dev)
    return None if check is None else check.accuracy
