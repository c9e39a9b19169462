"""One more label on a live classifier (`labels.py`), for every registered method, trained and reloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.calibration import calibrated_p_lm
from openbook.checkpoints import load_classifier, save_classifier
from openbook.classifier import Classifier
from openbook.labels import LabelError, add_label, add_labels, fit_to_labels
from openbook.methods import METHODS, weights_sha256
from openbook.methods.dart import DifferentiablePrompt
from openbook.methods.linear_probe import LinearProbeHead
from openbook.train_config import TrainConfig
from openbook.training import train

CONFIG = TrainConfig(steps=2, batch_size=4, lr=3e-3, eval_every=6, patience=10, warmup_ratio=0.0)
NEW_WORD = "boring"  # in the tiny tokenizers' corpus, and not a toy label word
SAMPLE = ["the movie was great and fun", "a bad film , it was awful", "who wrote the book"]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_reloaded_checkpoint_of_every_method_takes_a_label(
    name: str, causal_dir: Path, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    classifier, method = fresh_classifier(causal_dir, name)
    # the base weights' hash, from a backbone no method prepared (LoRA wraps its own view of them)
    base_sha = weights_sha256(load_backbone(BackboneConfig(name=str(causal_dir), max_length=48)).model)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    loaded, _ = save_and_reload(classifier, method, causal_dir, tmp_path, CONFIG, result, base_sha)
    grown = add_label(loaded, "2", NEW_WORD)
    assert grown.labels == ("0", "1", "2") and loaded.labels == ("0", "1")  # the old one is left as it was
    assert grown.store is loaded.store

    # The plain prompt's pass: the store keys do not move, and the old labels keep their odds.
    before, after = loaded.embed(SAMPLE, vectors_only=True), grown.embed(SAMPLE, vectors_only=True)
    np.testing.assert_array_equal(after.vectors, before.vectors)
    assert after.lm_log_probs.shape == (len(SAMPLE), 3)
    p_old = calibrated_p_lm(before.lm_log_probs, loaded.label_bias)
    p_new = calibrated_p_lm(after.lm_log_probs, grown.label_bias)
    np.testing.assert_allclose(p_new[:, :2] / p_new[:, :2].sum(1, keepdims=True), p_old, rtol=1e-4, atol=1e-6)
    assert (p_new[:, 2] > 0).all()

    # The new label's P_LM is the softmax over every label's score, its word's computed apart here.
    word_ids = loaded.backbone.tokenizer(" " + NEW_WORD, add_special_tokens=False)["input_ids"]
    expected = _independent_scores(loaded, word_ids)  # (N, 3)
    np.testing.assert_allclose(after.lm_log_probs, expected, rtol=1e-4, atol=1e-5)

    # An example of the new label, once in the store, is a neighbour that P_kNN puts mass on.
    grown.add_examples([SAMPLE[2]], ["2"], ids=[1000])
    prediction = grown.predict([SAMPLE[2]])[0]
    assert set(prediction.probabilities) == {"0", "1", "2"}
    assert prediction.p_knn is not None and prediction.p_knn["2"] > 0
    assert (1000, "2") in {(n.id, n.label) for n in prediction.neighbours}

    # The grown classifier is a whole one: it saves and loads back to the same predictions.
    path = save_classifier(
        tmp_path / "grown",
        grown,
        method,
        base_weights_sha256=base_sha,
        train_config=CONFIG,
        training_data_sha256="0" * 64,
        dev_metrics={},
    )
    again, _ = load_classifier(
        path, backbone=load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    )
    assert again.predict(SAMPLE) == grown.predict(SAMPLE)


def _independent_scores(classifier: Classifier, word_ids: list[int]) -> np.ndarray:
    """(N, C + 1) label scores of the plain prompt with `word_ids` as one more label word, from the
    backbone's outputs: the LM head's log-probabilities, or a label-scoring prompt's row for the word
    started from the word's LM-head row."""
    backbone, prompt = classifier.backbone, classifier.prompt
    batch = classifier.encoder.encode(SAMPLE)
    label_ids = [*classifier.encoder.label_token_ids, word_ids]
    with torch.no_grad():
        if prompt is None or not prompt.scores_labels:
            return backbone.forward(batch, label_ids, prompt=prompt).label_log_probs.numpy()
        features = _head_features(backbone, batch, prompt)  # (N, E')
        head = backbone.model.get_output_embeddings()
        word_row = head.weight[word_ids].mean(0).float()
        if isinstance(prompt, DifferentiablePrompt):
            rows = torch.cat([prompt.labels, word_row[None]])
            logits = features @ rows.T
            if prompt.label_bias is not None:
                logits = logits + torch.cat([prompt.label_bias, head.bias[word_ids].mean()[None]])
        else:
            assert isinstance(prompt, LinearProbeHead)
            weight, bias = prompt.linear.weight, prompt.linear.bias
            scaled = word_row / word_row.norm() * weight.norm(dim=1).mean()
            unit = features / features.norm(dim=1, keepdim=True)
            logits = unit @ torch.cat([weight, scaled[None]]).T + torch.cat([bias, bias.mean()[None]])
        return torch.log_softmax(logits, dim=-1).numpy()


def _head_features(backbone: Backbone, batch, prompt) -> torch.Tensor:
    """The LM head's input at the slot, read with a hook as the backbone itself reads it."""
    seen: list[torch.Tensor] = []
    hook = backbone.model.get_output_embeddings().register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    try:
        backbone.forward(batch, [[0], [1]], prompt=prompt)
    finally:
        hook.remove()
    return seen[-1][:, -1].float()  # causal: the slot is the last position


def test_the_log_prior_grows_by_the_mean_of_its_values(causal_backbone: Backbone, toy) -> None:
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    classifier.label_bias = np.log(np.array([0.2, 0.8], dtype=np.float32))
    grown = add_label(classifier, "2", NEW_WORD)
    np.testing.assert_allclose(grown.label_bias, [np.log(0.2), np.log(0.8), np.log(0.2 * 0.8) / 2], rtol=1e-6)
    assert grown.label_bias.dtype == np.float32
    assert (
        add_label(Classifier(causal_backbone, toy.template, toy.verbalizer), "2", NEW_WORD).label_bias is None
    )


def test_an_existing_label_or_an_unusable_word_is_a_label_error(
    causal_backbone: Backbone, masked_backbone: Backbone, toy
) -> None:
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    with pytest.raises(LabelError, match="label '1' exists"):
        add_label(classifier, "1", NEW_WORD)
    with pytest.raises(LabelError, match="same word"):
        add_label(classifier, "2", "good")
    with pytest.raises(LabelError, match="empty"):
        add_label(classifier, "2", " ")
    # The BERT tokenizer drops a zero-width space: a word of it alone has nothing to score.
    with pytest.raises(LabelError, match="tokenizes to nothing"):
        add_label(Classifier(masked_backbone, toy.template, toy.verbalizer), "2", "\u200b")
    assert classifier.labels == ("0", "1")


def test_fit_to_labels_grows_to_an_extension_and_refuses_anything_else(
    causal_backbone: Backbone, toy
) -> None:
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    assert fit_to_labels(classifier, {"0": "bad", "1": "good"}) is classifier
    grown = fit_to_labels(classifier, {"0": "bad", "1": "good", "2": "boring", "3": "fun"})
    assert grown.labels == ("0", "1", "2", "3") and grown.verbalizer.words[2:] == ("boring", "fun")
    for other in ({"1": "good", "0": "bad", "2": "x"}, {"0": "bad", "1": "great"}, {"0": "bad", "2": "x"}):
        with pytest.raises(LabelError, match="do not extend"):
            fit_to_labels(classifier, other)


def test_labels_added_together_serve_as_labels_added_one_by_one(causal_backbone: Backbone, toy) -> None:
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    classifier.label_bias = classifier.calibration_bias("content-free")
    together = add_labels(classifier, {"2": "boring", "3": "fun"})
    one_by_one = add_label(add_label(classifier, "2", "boring"), "3", "fun")
    assert together.labels == one_by_one.labels == ("0", "1", "2", "3")
    assert together.verbalizer.words == one_by_one.verbalizer.words
    assert together.label_bias is not None and one_by_one.label_bias is not None
    np.testing.assert_allclose(together.label_bias, one_by_one.label_bias)
    np.testing.assert_allclose(together.embed(SAMPLE).lm_log_probs, one_by_one.embed(SAMPLE).lm_log_probs)


def test_labels_added_together_are_all_added_or_none(causal_backbone: Backbone, toy) -> None:
    classifier = Classifier(causal_backbone, toy.template, toy.verbalizer)
    with pytest.raises(LabelError, match="label '3' would have the same word as label '1'"):
        add_labels(classifier, {"2": "boring", "3": "good"})
    with pytest.raises(LabelError, match="label '3' would have the same word as label '2'"):
        add_labels(classifier, {"2": "boring", "3": "boring"})
    with pytest.raises(LabelError, match="label '0' exists"):
        add_labels(classifier, {"2": "boring", "0": "fun"})
    assert classifier.labels == ("0", "1") and classifier.verbalizer.words == ("bad", "good")
