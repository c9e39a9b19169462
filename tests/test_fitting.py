"""The fit pipeline (`fitting.py`, run by `Estimator.fit` and `.save`): train, choose how the classifier
predicts, save; checked by loading back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openbook.backbone import BackboneConfig, load_backbone
from openbook.calibration import with_temperature
from openbook.checkpoints import load_classifier
from openbook.estimator import Estimator
from openbook.fitting import FitSets, LabelledTexts, StoreExamples, choose_knn_on_dev
from openbook.knn import KnnConfig
from openbook.selection import LAMBDA_GRID
from openbook.train_config import FEW_DEV_PER_LABEL, TrainConfig

BUDGET = {"steps": 4, "batch_size": 4, "lr": 3e-3, "eval_every": 2, "patience": 10, "warmup_ratio": 0.0}
CONFIG = TrainConfig(**BUDGET)
# Dev differs from train, so choosing on train instead of dev would show.
DEV = LabelledTexts(["great fun", "a good film", "boring and bad", "a terrible film"], np.array([1, 1, 0, 0]))


def names(classifier, labels) -> list[str]:
    return [classifier.labels[i] for i in labels]


def fit(classifier, method, path: Path, toy, dev: LabelledTexts = DEV, **options):
    """`Estimator.fit` on the toy set, `dev` given apart, then `save`: (the estimator, its report, the
    path)."""
    estimator = Estimator(classifier, method)
    report = estimator.fit(
        toy.texts,
        names(classifier, toy.labels),
        dev=(dev.texts, names(classifier, dev.labels)),
        dev_ids=None if dev.ids is None else dev.ids.tolist(),
        **BUDGET,
    )
    return estimator, report, estimator.save(path, **options)


def load(path: Path, model_dir: Path):
    """The checkpoint on a freshly loaded backbone, which has the base weights."""
    return load_classifier(path, backbone=load_backbone(BackboneConfig(name=str(model_dir), max_length=48)))


def test_a_knn_interp_method_is_saved_with_the_knn_setting_chosen_on_dev(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    assert method.inference == "knn-interp"
    estimator, report, path = fit(classifier, method, tmp_path / "ckpt", toy)
    classifier = estimator.classifier  # the trained classifier; its store, the train examples alone
    chosen, dev_accuracy = choose_knn_on_dev(classifier, DEV.texts, DEV.labels)
    assert classifier.knn == chosen and report.dev_metrics["accuracy_with_knn"] == dev_accuracy
    assert (chosen.k, chosen.temperature) == (len(toy.texts), KnnConfig().temperature)  # 8 stored, < 16
    assert chosen.lam in LAMBDA_GRID
    assert {"accuracy", "best_step", "step_budget", "steps_run"} <= set(report.dev_metrics)
    assert path == tmp_path / "ckpt" and report.result.steps_run == report.dev_metrics["steps_run"]

    loaded, _ = load(path, causal_dir)
    assert loaded.knn == chosen
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["dev_metrics"] == report.dev_metrics


@pytest.mark.parametrize("dev_size", [3, 4])
def test_few_dev_lam_sets_lambda_only_where_dev_holds_too_few_examples_per_label_to_choose_it(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier, dev_size: int
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    dev = LabelledTexts(DEV.texts[:dev_size], DEV.labels[:dev_size])
    estimator = Estimator(classifier, method)
    report = estimator.fit(
        toy.texts,
        names(classifier, toy.labels),
        dev=(dev.texts, names(classifier, dev.labels)),
        few_dev_lam=0.35,
        **BUDGET,
    )
    trained = estimator.classifier
    assert len(trained.labels) * FEW_DEV_PER_LABEL == 4  # 3 dev examples are too few, 4 are not
    if dev_size < 4:  # set: 0.35 is on no grid dev could choose from
        assert trained.knn.lam == 0.35 and 0.35 not in LAMBDA_GRID and report.dev_metrics["lam_set"] == 0.35
    else:
        assert (trained.knn, report.dev_metrics["accuracy_with_knn"]) == choose_knn_on_dev(
            trained, dev.texts, dev.labels
        )
        assert "lam_set" not in report.dev_metrics
    with pytest.raises(ValueError, match="few_dev_lam"):
        TrainConfig(few_dev_lam=1.5)


def test_any_other_method_is_saved_to_predict_from_the_prompt_alone(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    assert method.inference == "zero-shot"
    classifier.knn = KnnConfig(k=3, temperature=0.5, lam=0.4)
    _, report, path = fit(classifier, method, tmp_path / "ckpt", toy)
    assert "accuracy_with_knn" not in report.dev_metrics

    loaded, _ = load(path, causal_dir)
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
    estimator, report, path = fit(classifier, method, tmp_path / "ckpt", toy, dev=dev)
    classifier = estimator.classifier
    calibration = report.dev_metrics["calibration"]
    assert not calibration["adopted"]  # 4 dev examples: too few to adopt any temperature (quality.py)
    assert calibration["temperature"] == 1.0 and calibration["folds"] == 4
    assert report.dev_scores is not None
    assert report.dev_scores.ids.tolist() == [31, 7, 12, 90] and report.dev_scores.gold.tolist() == [
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
    np.testing.assert_allclose(report.dev_scores.probabilities, served, atol=1e-5)

    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["dev_scores"]["ids"] == [31, 7, 12, 90]
    np.testing.assert_allclose(manifest["dev_scores"]["probabilities"], served, atol=1e-5)
    loaded, _ = load(path, causal_dir)
    assert loaded.confidence_temperature == pytest.approx(calibration["temperature"])

    # the gate's score of this candidate, read from those dev scores, is the one `dev_check` computes
    # afresh (a store of the train examples), at a temperature that changes the likelihood
    from openbook.fitting import dev_check, served_dev_score

    classifier.confidence_temperature = 2.0
    words = [toy.verbalizer.labels[i] for i in toy.labels]
    afresh = dev_check(classifier, StoreExamples(toy.texts, words, np.arange(len(words))), dev)
    read = served_dev_score(report.dev_scores, 2.0)
    assert afresh is not None and read.accuracy == afresh.accuracy
    assert read.log_likelihood == pytest.approx(afresh.log_likelihood, abs=1e-5)
    assert read.log_likelihood != pytest.approx(served_dev_score(report.dev_scores, 1.0).log_likelihood)
    # and on some of dev (the gate's, where the serving version learnt the rest): those rows alone
    some = dev_check(
        classifier,
        StoreExamples(toy.texts, words, np.arange(len(words))),
        LabelledTexts([dev.texts[i] for i in (1, 3)], dev.labels[[1, 3]], np.array([7, 90])),
    )
    part = served_dev_score(report.dev_scores, 2.0, [90, 7])
    assert some is not None and part.accuracy == some.accuracy
    assert part.log_likelihood == pytest.approx(some.log_likelihood, abs=1e-5)


def test_the_store_holds_every_example_under_its_id_dev_held_out_included(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    texts = [*toy.texts[:4], *DEV.texts]
    labels = names(classifier, [*toy.labels[:4], *DEV.labels])
    ids = np.array([70, 10, 50, 30, 20, 80, 40, 60], dtype=np.int64)
    estimator = Estimator(classifier, method)
    report = estimator.fit(texts, labels, ids=ids.tolist(), **BUDGET)  # dev held out by the ids' hash
    assert sorted(report.train_ids + report.dev_ids) == sorted(ids.tolist()) and report.train_ids
    path = estimator.save(tmp_path / "ckpt", extra={"log_offset": 12})
    loaded, _ = load(path, causal_dir)
    np.testing.assert_array_equal(loaded.store.ids(), np.sort(ids))  # those ids only, dev's too
    np.testing.assert_array_equal(loaded.store.labels_of(ids), loaded.label_indices(labels))
    # The examples are embedded with the trained weights, as the saved classifier will embed queries.
    trained_keys = estimator.classifier.embed(texts, vectors_only=True).vectors
    np.testing.assert_allclose(loaded.store.vectors_of(ids), trained_keys, atol=1e-5)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["log_offset"] == 12 and manifest["dev_scored_on"] == (
        "dev" if report.dev_ids else "train"
    )


def test_a_dev_given_apart_chooses_but_is_not_stored(
    causal_dir: Path, tmp_path: Path, toy, fresh_classifier
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    estimator, report, path = fit(classifier, method, tmp_path / "ckpt", toy)
    assert report.train_ids == list(range(8)) and report.dev_ids == [0, 1, 2, 3]  # positions, each
    loaded, _ = load(path, causal_dir)
    assert loaded.store.ids().tolist() == report.train_ids
    assert loaded.store.texts_of(loaded.store.ids()) == toy.texts  # the train examples, not dev's
    np.testing.assert_allclose(
        loaded.store.vectors_of(loaded.store.ids()),
        estimator.classifier.embed_vectors(toy.texts).vectors,
        atol=1e-5,
    )
    assert estimator.dev_scored_on == "dev"


def test_an_exception_from_on_step_stops_training_there(causal_dir: Path, toy, fresh_classifier) -> None:
    """How a service job is cancelled: its `on_step` raises, and `fit` stops at that step."""
    classifier, method = fresh_classifier(causal_dir, "prompt-ft")
    estimator = Estimator(classifier, method)
    steps: list[int] = []

    class Cancelled(Exception):
        pass

    def on_step(step: int, total: int, loss: float) -> None:
        steps.append(step)
        if step == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        estimator.fit(toy.texts, names(classifier, toy.labels), on_step=on_step, **BUDGET)
    assert steps == [1, 2] and estimator.record is None


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
    names_ = [toy.verbalizer.labels[i] for i in labels]
    # the store served as training left it: the train examples under their positions
    as_trained = StoreExamples(train_set.texts, [names_[i] for i in train_ids], np.arange(len(train_ids)))
    fit_classifier(classifier, method, FitSets(train_set, dev_set, as_trained, True), CONFIG, progress=False)
    everything = StoreExamples(
        [*toy.texts, "an example in neither set"], [*names_, names_[0]], np.arange(len(labels) + 1)
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
