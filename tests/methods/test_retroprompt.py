"""RetroPrompt's own parts: the kNN-guided loss weights, the demos option and its backbone checks, and
each demonstration mode trained, predicting and reloaded.

Its training and checkpoint round trip run beside prompt-ft's in tests/test_training.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.demonstrations import DemoConfig
from openbook.methods.retroprompt import RetroPromptConfig, knn_guided_weights
from openbook.store import KnowledgeStore
from openbook.training import TrainConfig, train

from tests.test_checkpoints import HALF_PROBABILITY_ATOL


def test_knn_guided_weights_are_leave_one_out() -> None:
    store = KnowledgeStore(2)
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    store.add(np.arange(3), vectors, np.array([0, 1, 1]))
    gold = torch.tensor([0, 1])
    config = RetroPromptConfig(knn_loss=True, k=2, temperature=0.1, min_p_knn=1e-6, beta=1.0)
    weights = knn_guided_weights(store, vectors[:2], np.array([0, 1]), gold, 2, config)
    # Example 0 is the only label-0 item: without itself its neighbours are all label 1, so p_kNN(gold) is
    # tiny and the weight large. Example 1 still has example 2 (same vector, label 1) as a neighbour.
    assert weights[0] > 10.0
    assert weights[1] < 1.5


def test_demonstrations_refuse_a_backbone_whose_embeddings_are_not_the_slot_size(
    albert_dir: Path, fresh_classifier
) -> None:
    with pytest.raises(ValueError, match="demos=text or retroprompt/demos=none, which shows none"):
        fresh_classifier(albert_dir, "retroprompt/demos=neural")
    classifier, _ = fresh_classifier(albert_dir, "retroprompt/demos=none")
    assert classifier.demos is None


def test_demos_option_parses_its_modes_aliases_and_older_booleans() -> None:
    from openbook.methods import build_method
    from openbook.methods.base import MethodError

    assert RetroPromptConfig().demos == "neural"  # the paper's, chosen on dev
    assert build_method("retroprompt/no-demos").config == build_method("retroprompt/demos=none").config
    assert build_method("retroprompt/demos=neural").spec == "retroprompt"  # written as the default it is
    assert build_method("retroprompt/no-demos").spec == "retroprompt/demos=none"  # an older spelling
    # checkpoints and configs written when demonstrations were on or off
    assert RetroPromptConfig(demos=True).demos == "neural" and RetroPromptConfig(demos=False).demos == "none"
    text = build_method("retroprompt/demos=text/demo-texts=2").config
    assert text.demo_config() == DemoConfig(m=2, mode="text")
    assert build_method("retroprompt/demos=words").config.demo_config() == DemoConfig(m=4, mode="words")
    assert build_method("retroprompt/no-demos").config.demo_config() is None
    for bad, match in [
        ("retroprompt/demos=vectors", "demos must be one of neural, words, text, none"),
        ("retroprompt/demo-texts=2", "add demos=text"),
        ("retroprompt/demos=text/demo-m=2", "demo_m apply to neural and words"),
        ("retroprompt/demos=text/demo-texts=0", "at least 1"),
    ]:
        with pytest.raises(MethodError, match=match):
            build_method(bad)


def test_word_demonstrations_refuse_a_head_narrower_than_the_slot(albert_dir: Path, fresh_classifier) -> None:
    with pytest.raises(ValueError, match="demos=words reads slot vectors"):
        fresh_classifier(albert_dir, "retroprompt/demos=words")
    classifier, _ = fresh_classifier(albert_dir, "retroprompt/demos=text")  # texts fit any backbone
    assert classifier.demos is not None and classifier.demos.mode == "text"


DISTINCT = [  # no text twice, so a retrieved text that equals the row's own would be the row itself
    "the movie was great and fun",
    "a good film with a great cast",
    "it was terrible and boring",
    "a bad film , it was awful",
    "great fun",
    "a good film",
    "it was awful",
    "a bad film",
]
QUICK = TrainConfig(steps=2, batch_size=4, lr=1e-3, eval_every=2, patience=5, warmup_ratio=0.0)


def test_text_demonstrations_in_training_never_show_an_example_itself(
    causal_dir: Path, toy, fresh_classifier, monkeypatch
) -> None:
    classifier, method = fresh_classifier(causal_dir, "retroprompt/demos=text/demo-texts=2")
    assert classifier.demo_encoder is not None
    shown: list[tuple[list, list]] = []
    encode = classifier.demo_encoder.encode

    def recording(texts, demos=None):
        shown.append((list(texts), [list(row) for row in demos]))
        return encode(texts, demos=demos)

    monkeypatch.setattr(classifier.demo_encoder, "encode", recording)
    labels = np.array([1, 1, 0, 0, 1, 1, 0, 0])
    dev = ["a great cast", "boring"]  # not in the store: no dev row can be shown its own text either
    train(classifier, method, DISTINCT, labels, dev, labels[:2], QUICK, progress=False)
    rows = [(text, row) for texts, demos in shown for text, row in zip(texts, demos, strict=True)]
    # calibration's pass over every training text, dev at steps 0 and 2, two steps of 4
    assert len(rows) == len(DISTINCT) + 2 * len(dev) + QUICK.steps * QUICK.batch_size
    for text, row in rows:
        assert text not in [demo for demo, _ in row]
        assert [label for _, label in row] == [0, 1, 0, 1]  # nearest of each class, then the second


@pytest.mark.parametrize(
    "spec", ["retroprompt/demos=neural", "retroprompt/demos=words", "retroprompt/demos=text"]
)
def test_each_demos_mode_trains_predicts_and_round_trips(
    model_dir: Path, spec: str, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    from openbook.methods import weights_sha256

    classifier, method = fresh_classifier(model_dir, spec)
    base_sha = weights_sha256(classifier.backbone.model)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, QUICK, progress=False)
    assert len(result.losses) == QUICK.steps and np.isfinite(result.losses).all()
    plain = fresh_classifier(model_dir, "retroprompt/demos=none")[0]
    plain.backbone.model.load_state_dict(classifier.backbone.model.state_dict())
    plain.store, plain.label_bias = classifier.store, classifier.label_bias
    before = classifier.predict(toy.texts[:4])
    assert [p.p_lm for p in before] != [p.p_lm for p in plain.predict(toy.texts[:4])]  # the demos are read
    loaded, _ = save_and_reload(classifier, method, model_dir, tmp_path, QUICK, result, base_sha)
    assert loaded.demos == classifier.demos
    # demos=text reads the neighbours' texts from the reloaded store (a missing one is a KeyError)
    for a, b in zip(loaded.predict(toy.texts[:4]), before, strict=True):
        assert a.label == b.label and a.p_lm == pytest.approx(b.p_lm, abs=HALF_PROBABILITY_ATOL)
