"""`fit_and_save` (`fitting.py`): train, choose how the classifier predicts, save; checked by loading back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openbook.backbone import BackboneConfig, load_backbone
from openbook.calibration import with_temperature
from openbook.checkpoints import load_classifier
from openbook.fitting import LabelledTexts, StoreExamples, fit_and_save
from openbook.knn import KnnConfig
from openbook.methods import weights_sha256
from openbook.selection import LAMBDA_GRID, choose_knn_on_dev
from openbook.train_config import TrainConfig

CONFIG = TrainConfig(steps=4, batch_size=4, lr=3e-3, eval_every=2, patience=10, warmup_ratio=0.0)
# Dev differs from train, so choosing on train instead of dev would show.
DEV = LabelledTexts(["great fun", "a good film", "boring and bad", "a terrible film"], np.array([1, 1, 0, 0]))


def fit(classifier, method, path: Path, toy, **options):
    return fit_and_save(
        path,
        classifier,
        method,
        LabelledTexts(toy.texts, toy.labels),
        DEV,
        CONFIG,
        base_weights_sha256=weights_sha256(classifier.backbone.model),  # before training changes them
        training_data_sha256="0" * 64,
        progress=False,
        **options,
    )


def load(path: Path, model_dir: Path):
    """The checkpoint on a freshly loaded backbone, which has the base weights."""
    return load_classifier(path, backbone=load_backbone(BackboneConfig(name=str(model_dir), max_length=48)))


def test_a_knn_interp_method_is_saved_with_the_knn_setting_chosen_on_dev(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    assert method.inference == "knn-interp"
    fitted = fit(classifier, method, tmp_path / "ckpt", toy)
    chosen, dev_accuracy = choose_knn_on_dev(classifier, DEV.texts, DEV.labels)  # the trained classifier
    assert classifier.knn == chosen and fitted.dev_metrics["accuracy_with_knn"] == dev_accuracy
    assert (chosen.k, chosen.temperature) == (len(toy.texts), KnnConfig().temperature)  # 8 stored, < 16
    assert chosen.lam in LAMBDA_GRID
    assert {"accuracy", "best_step", "step_budget", "steps_run"} <= set(fitted.dev_metrics)
    assert fitted.path == tmp_path / "ckpt" and fitted.result.steps_run == fitted.dev_metrics["steps_run"]

    loaded, _ = load(fitted.path, causal_dir)
    assert loaded.knn == chosen
    manifest = json.loads((fitted.path / "manifest.json").read_text())
    assert manifest["dev_metrics"] == fitted.dev_metrics


def test_any_other_method_is_saved_to_predict_from_the_prompt_alone(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    assert method.inference == "zero-shot"
    classifier.knn = KnnConfig(k=3, temperature=0.5, lam=0.4)
    fitted = fit(classifier, method, tmp_path / "ckpt", toy)
    assert "accuracy_with_knn" not in fitted.dev_metrics

    loaded, _ = load(fitted.path, causal_dir)
    assert loaded.knn == KnnConfig(k=3, temperature=0.5, lam=0.0)  # lambda 0; k and T as they were
    for prediction in loaded.predict(DEV.texts):  # the prompt's distribution, at the confidence temperature
        p_lm = np.array([list(prediction.p_lm.values())])
        expected = with_temperature(p_lm, loaded.confidence_temperature)[0]
        assert list(prediction.probabilities.values()) == pytest.approx(expected.tolist(), abs=1e-6)


def test_confidence_is_calibrated_on_dev_and_the_dev_scores_kept(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    dev = LabelledTexts(DEV.texts, DEV.labels, np.array([31, 7, 12, 90]))
    fitted = fit_and_save(
        tmp_path / "ckpt",
        classifier,
        method,
        LabelledTexts(toy.texts, toy.labels),
        dev,
        CONFIG,
        base_weights_sha256=weights_sha256(classifier.backbone.model),
        training_data_sha256="0" * 64,
        progress=False,
    )
    calibration = fitted.dev_metrics["calibration"]
    assert not calibration["adopted"]  # 4 dev examples: too few to adopt any temperature (quality.py)
    assert calibration["temperature"] == 1.0 and calibration["folds"] == 4
    assert fitted.dev_scores is not None
    assert fitted.dev_scores.ids.tolist() == [31, 7, 12, 90] and fitted.dev_scores.gold.tolist() == [
        1,
        1,
        0,
        0,
    ]
    # the dev scores are those of the served prediction before the temperature (the store: train only)
    classifier.confidence_temperature = 1.0
    classifier.store = classifier.empty_store()
    classifier.add_examples(toy.texts, [toy.verbalizer.labels[i] for i in toy.labels])
    served = classifier.score(classifier.embed(DEV.texts)).probabilities
    np.testing.assert_allclose(fitted.dev_scores.probabilities, served, atol=1e-5)

    manifest = json.loads((fitted.path / "manifest.json").read_text())
    assert manifest["dev_scores"]["ids"] == [31, 7, 12, 90]
    np.testing.assert_allclose(manifest["dev_scores"]["probabilities"], served, atol=1e-5)
    loaded, _ = load(fitted.path, causal_dir)
    assert loaded.confidence_temperature == pytest.approx(calibration["temperature"])

    # the gate's score of this candidate, read from those dev scores, is the one `dev_check` computes
    # afresh (a store of the train examples), at a temperature that changes the likelihood
    from openbook.fitting import dev_check, served_dev_score

    classifier.confidence_temperature = 2.0
    words = [toy.verbalizer.labels[i] for i in toy.labels]
    afresh = dev_check(classifier, StoreExamples(toy.texts, words, np.arange(len(words))), dev)
    read = served_dev_score(fitted.dev_scores, 2.0)
    assert afresh is not None and read.accuracy == afresh.accuracy
    assert read.log_likelihood == pytest.approx(afresh.log_likelihood, abs=1e-5)
    assert read.log_likelihood != pytest.approx(served_dev_score(fitted.dev_scores, 1.0).log_likelihood)


def test_store_examples_replace_the_store_with_those_ids(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    texts = [*toy.texts[:4], *DEV.texts]
    labels = [toy.verbalizer.labels[i] for i in [*toy.labels[:4], *DEV.labels]]
    ids = np.array([70, 10, 50, 30, 20, 80, 40, 60], dtype=np.int64)
    fitted = fit(
        classifier,
        method,
        tmp_path / "ckpt",
        toy,
        store_examples=StoreExamples(texts, labels, ids),
        extra={"log_offset": 12},
    )
    loaded, _ = load(fitted.path, causal_dir)
    np.testing.assert_array_equal(loaded.store.ids(), np.sort(ids))  # those ids only: no training example
    np.testing.assert_array_equal(loaded.store.labels_of(ids), loaded.label_indices(labels))
    # The examples are embedded with the trained weights, as the saved classifier will embed queries.
    trained_keys = classifier.embed(texts, vectors_only=True).vectors
    np.testing.assert_allclose(loaded.store.vectors_of(ids), trained_keys, atol=1e-5)
    assert json.loads((fitted.path / "manifest.json").read_text())["log_offset"] == 12


def test_the_served_store_keeps_the_keys_training_took(
    causal_dir: Path, toy, fresh_classifier, monkeypatch
) -> None:
    """After training, the store of every example under its id reuses the train examples' keys and dev's
    vectors; only an example in neither is embedded, and the keys are those a fresh pass gives."""
    from openbook.fitting import fit_classifier, serve_store

    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    labels = np.asarray(toy.labels)
    train_ids, dev_ids = np.arange(0, len(labels), 2), np.arange(1, len(labels), 2)
    train_set = LabelledTexts([toy.texts[i] for i in train_ids], labels[train_ids], train_ids)
    dev_set = LabelledTexts([toy.texts[i] for i in dev_ids], labels[dev_ids], dev_ids)
    fit_classifier(classifier, method, train_set, dev_set, CONFIG, progress=False)
    names = [toy.verbalizer.labels[i] for i in labels]
    everything = StoreExamples(
        [*toy.texts, "an example in neither set"], [*names, names[0]], np.arange(len(labels) + 1)
    )
    embedded: list[int] = []
    fresh = classifier.embed_vectors
    monkeypatch.setattr(
        classifier, "embed_vectors", lambda texts, **k: embedded.append(len(texts)) or fresh(texts, **k)
    )
    serve_store(classifier, everything, train_set, dev_set, classifier.embed(dev_set.texts))
    assert embedded == [1]  # the example in neither set
    np.testing.assert_allclose(
        classifier.store.vectors_of(everything.ids), fresh(everything.texts).vectors, atol=1e-5
    )
    assert classifier.store.texts_of([len(labels)]) == ["an example in neither set"]


def test_labelled_texts_need_one_label_per_text(toy) -> None:
    with pytest.raises(ValueError, match="8 texts but 7 labels"):
        LabelledTexts(toy.texts, toy.labels[:7])


def test_dev_accuracy_never_finds_a_dev_example_among_the_neighbours(
    causal_dir: Path, fresh_classifier
) -> None:
    from openbook.fitting import dev_accuracy

    classifier, _ = fresh_classifier(causal_dir, "retroprompt")
    classifier.knn = KnnConfig(k=1, temperature=0.01, lam=1.0)  # the nearest neighbour's label alone
    words = classifier.verbalizer.labels
    # Each dev text's twin is in the served store under the wrong label; it must not be asked.
    classifier.add_examples(DEV.texts, [words[1 - i] for i in DEV.labels], ids=np.arange(100, 104))
    train = StoreExamples(DEV.texts, [words[i] for i in DEV.labels], np.arange(4))
    assert dev_accuracy(classifier, train, DEV) == 1.0  # the train twins, correctly labelled, answer
    assert classifier.store.ids().tolist() == [100, 101, 102, 103]  # the served store is left alone
    assert dev_accuracy(classifier, train, LabelledTexts([], np.array([], dtype=np.int64))) is None


def test_dev_check_ranks_an_accuracy_tie_by_the_gold_likelihood(causal_dir: Path, fresh_classifier) -> None:
    from openbook.fitting import dev_check

    classifier, _ = fresh_classifier(causal_dir, "retroprompt")
    classifier.knn = KnnConfig(k=1, temperature=0.01, lam=1.0)  # the nearest neighbour's label alone
    words = classifier.verbalizer.labels
    train = StoreExamples(DEV.texts, [words[i] for i in DEV.labels], np.arange(4))
    sure = dev_check(classifier, train, DEV)
    classifier.knn = KnnConfig(k=1, temperature=0.01, lam=0.6)  # the same answers, less sure of them
    unsure = dev_check(classifier, train, DEV)
    assert sure is not None and unsure is not None
    assert sure.accuracy == unsure.accuracy == 1.0
    assert sure.log_likelihood == pytest.approx(0.0, abs=1e-3) and unsure.log_likelihood < sure.log_likelihood
    assert unsure.key() < sure.key()
