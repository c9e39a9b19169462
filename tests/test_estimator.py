"""`estimator.py`: create, fit, save and load, checked against the fit pipeline's steps (`fitting.py`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import openbook
import pytest
from openbook.backbone import BackboneConfig, load_backbone
from openbook.checkpoints import load_classifier
from openbook.classifier import Classifier
from openbook.dev_split import split_dev
from openbook.fitting import FitSets, TrainingRecord, fit_classifier, save_fitted
from openbook.methods import build_method, weights_sha256
from openbook.prompting import PromptError, Template, Verbalizer
from openbook.train_config import TrainConfig
from openbook.untrained import UNTRAINED_KNN

TEMPLATE = "{text} It was {mask}"
LABELS = {"0": "bad", "1": "good"}
# Small and fast; a step budget, so both runs take the same steps whatever the split.
BUDGET = {"steps": 4, "batch_size": 4, "lr": 3e-3, "eval_every": 2, "patience": 10, "warmup_ratio": 0.0}
QUERIES = ["great fun", "it was awful", "what is the answer to this question"]


def fresh_backbone(model_dir: Path):
    """A newly loaded backbone: training changes its weights in place."""
    return load_backbone(BackboneConfig(name=str(model_dir), max_length=48))


def probabilities(predictions) -> np.ndarray:
    return np.array([list(p.probabilities.values()) for p in predictions])


def labelled_examples(toy) -> tuple[list[str], list[str]]:
    """The toy set twice over (16 examples, so that dev holds both labels), labels as strings."""
    return toy.texts * 2, [toy.verbalizer.labels[i] for i in toy.labels] * 2


@pytest.mark.parametrize("spec", ["retroprompt", "prompt-ft"])
def test_fit_is_the_fit_pipeline_on_the_services_split(
    causal_dir: Path, tmp_path: Path, spec: str, toy
) -> None:
    estimator = openbook.create_classifier(TEMPLATE, LABELS, backbone=fresh_backbone(causal_dir), method=spec)
    texts, gold = labelled_examples(toy)
    report = estimator.fit(texts, gold, **BUDGET)

    # The fit pipeline's steps by hand (fitting.py), on a classifier built as cli.common.classifier_from_args
    # builds one, on the split and the store the service's trainer gives the same examples.
    backbone = fresh_backbone(causal_dir)
    base_sha = weights_sha256(backbone.model)
    method = build_method(spec)
    base = Classifier(backbone, Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    classifier = method.prepare(dataclasses.replace(base, store=base.empty_store(), label_bias=None))
    examples = dict(enumerate(zip(texts, gold, strict=True)))
    train_ids, dev_ids = split_dev(examples)
    sets = FitSets.of(classifier, examples)  # the examples under their ids, as the service's trainer
    assert (sets.train.example_ids().tolist(), sets.dev_ids()) == (train_ids, dev_ids)
    dev_metrics, _, dev_scores = fit_classifier(
        classifier, method, sets, TrainConfig(**BUDGET), progress=False
    )
    record = TrainingRecord(
        base_sha, sets.training_data_sha256(), TrainConfig(**BUDGET), dev_metrics, dev_scores
    )
    reference = save_fitted(tmp_path / "reference", classifier, method, record)

    assert (report.train_ids, report.dev_ids) == (train_ids, dev_ids) and len(dev_ids) >= 2
    assert report.dev_metrics == dev_metrics
    assert report.dev_accuracy == dev_metrics.get("accuracy_with_knn", dev_metrics["accuracy"])
    assert ("accuracy_with_knn" in report.dev_metrics) == (spec == "retroprompt")
    assert estimator.classifier.knn == classifier.knn
    assert estimator.classifier.confidence_temperature == classifier.confidence_temperature
    assert estimator.record is not None and estimator.record.dev_scores is not None
    assert dev_scores is not None
    np.testing.assert_array_equal(estimator.record.dev_scores.probabilities, dev_scores.probabilities)
    np.testing.assert_array_equal(
        probabilities(estimator.predict(QUERIES)), probabilities(classifier.predict(QUERIES))
    )

    # saved and loaded, it predicts as the reference checkpoint does, and as it did up to the half precision
    # that checkpoints keep trained weights in (test_checkpoints.py)
    loaded = openbook.load(estimator.save(tmp_path / "fit"))
    served, before = probabilities(loaded.predict(QUERIES)), probabilities(estimator.predict(QUERIES))
    assert (served.argmax(1) == before.argmax(1)).all() and np.abs(served - before).max() < 1e-3
    assert (
        loaded.record is not None and loaded.record.dev_scores is not None and loaded.dev_scored_on == "dev"
    )
    for field in ("base_weights_sha256", "training_data_sha256", "train_config", "dev_metrics"):
        assert getattr(loaded.record, field) == getattr(estimator.record, field), field
    np.testing.assert_allclose(  # kept to 6 decimals
        loaded.record.dev_scores.probabilities, estimator.record.dev_scores.probabilities, atol=1e-6
    )
    ours = json.loads((tmp_path / "fit" / "manifest.json").read_text())
    theirs = json.loads((reference / "manifest.json").read_text())
    for key in ("dev_metrics", "knn", "confidence_temperature", "training_data_sha256", "backbone", "spec"):
        assert ours[key] == theirs[key], key
    trained, _ = load_classifier(reference)
    np.testing.assert_array_equal(
        probabilities(trained.predict(QUERIES)), probabilities(loaded.predict(QUERIES))
    )
    with pytest.raises(ValueError, match="trained already"):
        estimator.fit(texts, gold, **BUDGET)


def test_a_new_classifier_is_an_untrained_service_task(causal_backbone) -> None:
    estimator = openbook.create_classifier(
        TEMPLATE, ["book_flight", "transferMoney"], backbone=causal_backbone
    )
    classifier = estimator.classifier
    assert estimator.labels == ("book_flight", "transferMoney")
    assert classifier.verbalizer.words == (
        "book flight",
        "transfer money",
    )  # label names, as a task takes them
    assert estimator.method.spec == "retroprompt" and classifier.knn == UNTRAINED_KNN
    assert classifier.label_bias is not None
    np.testing.assert_array_equal(classifier.label_bias, classifier.calibration_bias("content-free"))
    proba = estimator.predict_proba(QUERIES)
    assert proba.shape == (3, 2) and np.allclose(proba.sum(1), 1.0)
    with pytest.raises(ValueError, match="call fit first"):
        estimator.save("unused")
    # exact scoring by default at two labels, as a task's: these multi-token words take a pass over their
    # tree; label vectors on request, as a task's `label_scoring`, or by default above 16 labels, take none
    assert classifier.label_scoring == "exact" and classifier.scores_words_by_tree
    names = ["book_flight", "transferMoney"]
    cheap = openbook.create_classifier(TEMPLATE, names, backbone=causal_backbone, label_scoring="vectors")
    assert cheap.classifier.label_scoring == "vectors" and not cheap.classifier.scores_words_by_tree
    many = [f"book_flight_{n}" for n in range(17)]
    assert (
        openbook.create_classifier(TEMPLATE, many, backbone=causal_backbone).classifier.label_scoring
        == "vectors"
    )
    exact = openbook.create_classifier(TEMPLATE, many, backbone=causal_backbone, label_scoring="exact")
    assert exact.classifier.label_scoring == "exact" and exact.classifier.scores_words_by_tree


def test_bad_examples_fail_before_any_training(causal_backbone) -> None:
    estimator = openbook.create_classifier(TEMPLATE, LABELS, backbone=causal_backbone, method="prompt-ft")
    with pytest.raises(PromptError, match="unknown label 'meh'"):
        estimator.fit(["great", "awful"], ["1", "meh"])
    with pytest.raises(ValueError, match="at least 2 labels"):
        estimator.fit(["great", "fun"], ["1", "1"])
    with pytest.raises(ValueError, match="distinct id"):
        estimator.fit(["great", "awful"], ["1", "0"], ids=[3, 3])
    assert estimator.record is None
