import numpy as np
import pytest
import torch
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.prompting import PromptError, Template, Verbalizer

TEMPLATE = Template("{text} It was {mask}")
VERBALIZER = Verbalizer.parse("neg=bad,pos=good")
TRAIN = [
    "the movie was great and fun",
    "a good film with a great cast",
    "it was terrible and boring",
    "a bad film",
]
TRAIN_LABELS = ["pos", "pos", "neg", "neg"]


@pytest.fixture()
def classifier(backbone):
    return Classifier(backbone, TEMPLATE, VERBALIZER, knn=KnnConfig(k=3, temperature=0.5, lam=0.4))


def test_prediction_carries_lm_knn_and_neighbours(classifier):
    ids = classifier.add_examples(TRAIN, TRAIN_LABELS, ids=[10, 11, 12, 13])
    assert ids.tolist() == [10, 11, 12, 13] and len(classifier.store) == 4
    (prediction,) = classifier.predict(["the movie was great and fun"])
    assert len(prediction.neighbours) == 3
    top = prediction.neighbours[0]
    assert top.id == 10 and top.label == "pos" and top.similarity == pytest.approx(1.0, abs=1e-5)
    assert prediction.p_knn is not None
    for label in ("neg", "pos"):
        expected = 0.4 * prediction.p_knn[label] + 0.6 * prediction.p_lm[label]
        assert prediction.probabilities[label] == pytest.approx(expected, abs=1e-6)
    assert prediction.label == max(prediction.probabilities, key=prediction.probabilities.get)
    assert sum(prediction.probabilities.values()) == pytest.approx(1.0, abs=1e-6)


def test_empty_store_predicts_from_the_lm_alone(classifier):
    (prediction,) = classifier.predict(["a good film"])
    assert prediction.p_knn is None and prediction.neighbours == ()
    assert prediction.probabilities == pytest.approx(prediction.p_lm)


def test_label_bias_shifts_p_lm(classifier):
    plain = classifier.predict(["a good film"])[0].p_lm
    classifier.label_bias = np.array([0.0, np.log(4.0)], dtype=np.float32)
    shifted = classifier.predict(["a good film"])[0].p_lm
    ratio_plain = plain["pos"] / plain["neg"]
    assert shifted["pos"] / shifted["neg"] == pytest.approx(ratio_plain / 4, rel=1e-4)


def test_leave_one_out_scores_never_use_the_query_itself(classifier):
    ids = classifier.add_examples(TRAIN, TRAIN_LABELS)
    embeddings = classifier.embed(TRAIN)
    scores = classifier.score(embeddings, exclude_ids=ids)
    assert scores.hits is not None
    assert not (scores.hits.ids == ids[:, None]).any()
    with_self = classifier.score(embeddings)
    assert with_self.hits is not None and (with_self.hits.ids[:, 0] == ids).all()


def test_unknown_label_and_empty_text_leave_the_store_untouched(classifier):
    classifier.add_examples(TRAIN[:2], TRAIN_LABELS[:2])
    with pytest.raises(PromptError, match="unknown label"):
        classifier.add_examples(["a text", "another"], ["pos", "meh"])
    with pytest.raises(PromptError, match="empty"):
        classifier.add_examples(["a text", "  "], ["pos", "neg"])
    assert len(classifier.store) == 2


def test_truncation_is_reported(classifier):
    (prediction,) = classifier.predict([" ".join(["the movie was great"] * 50)])
    assert prediction.truncated


def test_demonstrations_change_p_lm_but_not_the_store_keys(backbone):
    from openbook.demonstrations import DemoConfig

    plain = Classifier(backbone, TEMPLATE, VERBALIZER)
    demo = Classifier(backbone, TEMPLATE, VERBALIZER, demos=DemoConfig(m=2, temperature=0.5))
    for c in (plain, demo):
        c.add_examples(TRAIN, TRAIN_LABELS)
    query = ["a good film with a great cast , fun"]
    with torch.no_grad():
        a, b = plain.embed(query), demo.embed(query)
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-5)  # kNN keys/queries: plain prompt
    assert not np.allclose(a.lm_log_probs, b.lm_log_probs)


def test_an_empty_batch_is_a_clear_error(classifier):
    with pytest.raises(PromptError, match="no texts"):
        classifier.predict([])
