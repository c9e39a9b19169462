"""`quality.py`: the report against brute-force loops, calibration, abstention, and leave-one-out suspects."""

import numpy as np
import pytest
from openbook.calibration import with_temperature
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.prompting import Template, Verbalizer
from openbook.quality import (
    SLOT_VECTORS,
    Scored,
    abstains,
    calibrate,
    fit_temperature,
    leave_one_out,
    most_confused,
    quality_report,
    readers_of,
    readers_on_dev,
    threshold_for_accuracy,
)

LABELS = ("a", "b", "c")


def _random_scored(n: int = 200, seed: int = 0, num_labels: int = 3) -> Scored:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, num_labels)) * 3
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    # gold drawn from P itself: calibrated, so accuracy rises with confidence
    gold = (rng.random((n, 1)) > probabilities.cumsum(1)).sum(1).clip(max=num_labels - 1)
    return Scored(np.arange(100, 100 + n), gold, probabilities)


def test_report_equals_brute_force():
    scored = _random_scored()
    report = quality_report(scored, LABELS)
    n = len(scored.ids)
    predicted = [max(range(3), key=lambda c: scored.probabilities[i, c]) for i in range(n)]
    confusion = [[0] * 3 for _ in range(3)]
    for i in range(n):
        confusion[scored.gold[i]][predicted[i]] += 1
    assert report.confusion.tolist() == confusion
    assert report.confusion.sum() == n == report.examples
    assert report.accuracy == pytest.approx(np.trace(report.confusion) / report.confusion.sum())
    assert report.accuracy == pytest.approx(
        sum(p == g for p, g in zip(predicted, scored.gold, strict=True)) / n
    )
    f1s = []
    for c, label in enumerate(LABELS):
        tp = sum(1 for i in range(n) if predicted[i] == c and scored.gold[i] == c)
        precision = tp / sum(1 for i in range(n) if predicted[i] == c)
        recall = tp / sum(1 for i in range(n) if scored.gold[i] == c)
        f1 = 2 * precision * recall / (precision + recall)
        got = report.per_label[label]
        assert (got.precision, got.recall, got.f1) == pytest.approx((precision, recall, f1))
        assert got.support == sum(1 for g in scored.gold if g == c)
        f1s.append(f1)
    assert report.macro_f1 == pytest.approx(sum(f1s) / 3)
    # ECE: ten equal-width bins of the top probability, weighted |accuracy - confidence|
    ece = 0.0
    for b in range(10):
        members = [
            i
            for i in range(n)
            if b / 10 <= scored.probabilities[i].max() < (b + 1) / 10
            or (b == 9 and scored.probabilities[i].max() == 1.0)
        ]
        assert report.reliability[b].count == len(members)
        if members:
            accuracy = sum(predicted[i] == scored.gold[i] for i in members) / len(members)
            confidence = sum(scored.probabilities[i].max() for i in members) / len(members)
            ece += len(members) / n * abs(accuracy - confidence)
    assert report.ece == pytest.approx(ece)
    for point in report.coverage:
        kept = [i for i in range(n) if scored.probabilities[i].max() >= point.threshold]
        assert point.coverage == pytest.approx(len(kept) / n)
        if kept:
            assert point.accuracy == pytest.approx(
                sum(predicted[i] == scored.gold[i] for i in kept) / len(kept)
            )
        else:
            assert point.accuracy is None
    wrong = sorted(
        (i for i in range(n) if predicted[i] != scored.gold[i] and scored.probabilities[i].max() >= 0.5),
        key=lambda i: -scored.probabilities[i].max(),
    )
    assert [s.id for s in report.suspects] == [int(scored.ids[i]) for i in wrong[:50]]


def test_a_label_never_predicted_scores_zero_not_nan():
    scored = Scored(np.arange(4), np.array([0, 0, 1, 2]), np.tile([0.8, 0.15, 0.05], (4, 1)))
    report = quality_report(scored, LABELS)
    assert report.per_label["b"].precision == 0.0 and report.per_label["b"].f1 == 0.0
    assert report.accuracy == 0.5 and not np.isnan(report.macro_f1)
    with pytest.raises(ValueError, match="no scored example"):
        quality_report(Scored(np.arange(0), np.arange(0), np.zeros((0, 3))), LABELS)


def test_most_confused_pairs_are_the_largest_off_diagonal_cells():
    rng = np.random.default_rng(3)
    labels = [f"label_{c}" for c in range(30)]
    confusion = rng.integers(0, 6, size=(30, 30)) * (rng.random((30, 30)) < 0.2)
    np.fill_diagonal(confusion, 50)  # the diagonal is right, never a confusion
    cells = [(-int(confusion[g, p]), g, p) for g in range(30) for p in range(30) if g != p]
    cells = [cell for cell in cells if cell[0] < 0]
    expected = [(labels[g], labels[p], -n) for n, g, p in sorted(cells)[:10]]  # ties in label order
    pairs = most_confused(confusion, labels)
    assert [(pair.label, pair.predicted, pair.count) for pair in pairs] == expected
    assert most_confused(np.diag([3, 4]), ["a", "b"]) == ()  # no error, no pair
    report = quality_report(_random_scored(), LABELS)
    assert report.confused_pairs == most_confused(report.confusion, LABELS)


def test_threshold_for_accuracy_keeps_the_most_traffic():
    report = quality_report(_random_scored(), LABELS)
    point = threshold_for_accuracy(report.coverage, 0.9)
    assert point is not None and point.accuracy >= 0.9
    lower = [p for p in report.coverage if p.threshold < point.threshold]
    assert all(p.accuracy is None or p.accuracy < 0.9 for p in lower)
    assert threshold_for_accuracy(report.coverage, 1.01) is None


def test_temperature_scaling_keeps_the_argmax_and_fixes_overconfidence():
    rng = np.random.default_rng(1)
    n = 400
    gold = rng.integers(0, 3, n)
    # 70% right, but said with ~99% confidence: overconfident
    predicted = np.where(rng.random(n) < 0.7, gold, (gold + 1) % 3)
    probabilities = np.full((n, 3), 0.005)
    probabilities[np.arange(n), predicted] = 0.99
    scored = Scored(np.arange(n), gold, probabilities)
    temperature = fit_temperature(probabilities, gold)
    assert temperature > 1.5
    rescaled = with_temperature(probabilities, temperature)
    assert (rescaled.argmax(1) == predicted).all()
    assert rescaled.sum(1) == pytest.approx(np.ones(n))
    calibration = calibrate(scored)
    assert calibration.adopted and calibration.temperature == calibration.fitted_temperature
    assert calibration.ece_after < calibration.ece_before - 0.1


def test_calibration_is_not_adopted_when_it_does_not_help():
    rng = np.random.default_rng(2)
    n = 400
    probabilities = rng.dirichlet([1, 1], n)  # calibrated by construction: gold drawn from P itself
    gold = (rng.random(n) > probabilities[:, 0]).astype(np.int64)
    calibration = calibrate(Scored(np.arange(n), gold, probabilities))
    assert calibration.ece_before < 0.1
    if not calibration.adopted:
        assert calibration.temperature == 1.0
    assert calibration.adopted == (calibration.ece_after < calibration.ece_before)


def test_too_few_examples_never_adopt_a_temperature():
    probabilities = np.array([[0.99, 0.01]] * 10)
    gold = np.array([0, 1] * 5)  # half wrong at 99%: a fit would find a high T
    small = calibrate(Scored(np.arange(10), gold, probabilities))
    assert small.fitted_temperature > 1 and small.ece_after < small.ece_before
    assert not small.adopted and small.temperature == 1.0
    large = calibrate(Scored(np.arange(40), np.tile(gold, 4), np.tile(probabilities, (4, 1))))
    assert large.adopted and large.temperature == large.fitted_temperature


def test_abstention_follows_the_threshold():
    assert abstains(0.59, 0.6) and not abstains(0.6, 0.6) and not abstains(0.2, None)
    assert not abstains(0.0, 0.0)


def test_confidence_temperature_rescales_served_probabilities(backbone):
    classifier = Classifier(backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good"))
    classifier.add_examples(["a good film", "a bad film"], ["1", "0"])
    plain = classifier.predict(["the movie was great"])[0]
    classifier.confidence_temperature = 3.0
    hot = classifier.predict(["the movie was great"])[0]
    assert hot.label == plain.label and hot.p_lm == plain.p_lm
    expected = with_temperature(np.array([list(plain.probabilities.values())]), 3.0)[0]
    assert list(hot.probabilities.values()) == pytest.approx(expected.tolist(), abs=1e-6)
    assert max(hot.probabilities.values()) < max(plain.probabilities.values())


# Two clusters a random tiny model tells apart: one sentence each, behind different first words.
A = [f"{word} the movie was great and fun" for word in ("yes", "no", "so", "it", "a")]
B = [f"{word} who wrote the book about the river" for word in ("yes", "no", "so", "it", "a")]


def test_a_mislabelled_example_is_the_top_suspect(causal_backbone):
    """Two clean clusters and one example of A labelled B: leave-one-out, its neighbours say A."""
    classifier = Classifier(
        causal_backbone,
        Template("{text} It was {mask}"),
        Verbalizer.parse("a=good,b=bad"),
        # The store alone judges, by plain cosine: centred, this random model puts the unlabelled copy
        # "the movie was great and fun" first among one A sentence's neighbours, which then counts as wrong.
        knn=KnnConfig(k=3, temperature=0.01, lam=1.0, similarity="cosine"),
    )
    texts = [*A, *B, "the movie was great and fun"]
    labels = ["a"] * len(A) + ["b"] * len(B) + ["b"]  # the last one is mislabelled
    ids = classifier.add_examples(texts, labels, ids=np.arange(50, 50 + len(texts)))
    scored = leave_one_out(classifier, texts, labels, ids)
    report = quality_report(scored, classifier.labels)
    assert report.suspects and report.suspects[0].id == int(ids[-1])
    assert (report.suspects[0].label, report.suspects[0].predicted) == ("b", "a")
    assert report.suspects[0].confidence > 0.9
    assert report.confusion.sum() == len(texts) and report.accuracy == pytest.approx(10 / 11)


def test_each_reader_alone_is_scored_beside_the_served_prediction(causal_backbone):
    """Leave-one-out keeps P_LM and P_kNN: the prompt alone scores as the prompt scores the texts with no
    store at all, and at λ = 1 the served prediction is the book's."""
    verbalizer = Verbalizer.parse("a=good,b=bad")
    knn = KnnConfig(k=3, temperature=0.01, lam=1.0, similarity="cosine")
    classifier = Classifier(causal_backbone, Template("{text} It was {mask}"), verbalizer, knn=knn)
    texts, labels = [*A, *B], ["a"] * len(A) + ["b"] * len(B)
    ids = classifier.add_examples(texts, labels, ids=np.arange(len(texts)))
    scored = leave_one_out(classifier, texts, labels, ids)
    readers = readers_of(scored, classifier.served_knn().lam, SLOT_VECTORS)

    alone = Classifier(causal_backbone, Template("{text} It was {mask}"), verbalizer, knn=knn)
    p_lm = alone.score(alone.embed(texts)).probabilities  # an empty store: the prompt alone
    assert readers.prompt == pytest.approx(float(np.mean(p_lm.argmax(1) == scored.gold)))
    assert readers.book == pytest.approx(quality_report(scored, classifier.labels).accuracy)
    assert (readers.lam, readers.book_keyed_by) == (1.0, SLOT_VECTORS)

    empty = Scored(scored.ids, scored.gold, scored.probabilities, scored.p_lm, None)
    assert readers_of(empty, None, SLOT_VECTORS).book is None
    both = Scored.concatenate([scored, scored])
    assert both.p_knn is not None and len(both.p_knn) == 2 * len(texts)
    assert Scored.concatenate([scored, empty]).p_knn is None  # kept only where every part has it
    with pytest.raises(ValueError, match="a reader's distributions"):
        Scored(scored.ids, scored.gold, scored.probabilities, scored.p_lm[:1])


def test_a_trained_versions_readers_are_read_from_what_its_manifest_recorded_of_dev():
    manifest = {
        "dev_metrics": {"accuracy": 0.8, "accuracy_with_knn": 0.9, "accuracy_knn_alone": 0.85},
        "knn": {"k": 16, "lam": 0.4},
        "reader": {"base": {"name": "mpnet"}},
    }
    readers = readers_on_dev(manifest)
    assert readers is not None and (readers.prompt, readers.book, readers.lam) == (0.8, 0.85, 0.4)
    assert readers.book_keyed_by == "mpnet"
    assert readers_on_dev({**manifest, "reader": None}).book_keyed_by == SLOT_VECTORS
    assert readers_on_dev({**manifest, "dev_metrics": {}}) is None  # trained without dev
