"""Prompt tuning, prefix tuning and P-tuning (built by peft) on tiny random backbones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.methods import MethodError, TrainBatch, build_method, weights_sha256
from openbook.methods.peft_prompts import KeyValuePrefix, VirtualTokens
from openbook.prompting import Template, Verbalizer
from openbook.train_config import TrainConfig
from openbook.training import train

CONFIG = TrainConfig(steps=60, batch_size=4, lr=1e-5, eval_every=10, patience=10, warmup_ratio=0.0)
SPECS = ["prompt-tuning/prompt-lr=0.1", "prefix-tuning/prompt-lr=0.1", "p-tuning/prompt-lr=0.01"]


def full_batch_loss(classifier: Classifier, method, toy) -> float:
    classifier.backbone.model.eval()
    with torch.no_grad():
        return float(
            method.loss(
                classifier, TrainBatch(toy.texts, torch.tensor(toy.labels), np.arange(len(toy.texts)))
            )
        )


@pytest.mark.parametrize("spec", SPECS)
def test_loss_falls_backbone_stays_frozen_and_checkpoint_round_trips(
    sharp_dir: Path, spec: str, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    classifier, method = fresh_classifier(sharp_dir, spec)
    base_sha = weights_sha256(classifier.backbone.model)
    weights_before = {k: v.clone() for k, v in classifier.backbone.model.state_dict().items()}
    prompt_before = {k: v.clone() for k, v in method.trained_tensors(classifier).items()}
    classifier.label_bias = None
    loss_before = full_batch_loss(classifier, method, toy)

    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    bias = classifier.label_bias
    classifier.label_bias = None  # the loss before training was measured without the calibration
    # The tiny BERT's vocabulary (trained afresh each session) varies, and with it how far a frozen
    # model can be steered: over 10 draws the kept loss was 0.26-0.88 of the initial one. Without
    # learning it stays at 1.0 (the loop would keep the step-0 prompt).
    assert full_batch_loss(classifier, method, toy) < 0.95 * loss_before
    classifier.label_bias = bias
    assert result.best.step > 0
    for name, tensor in classifier.backbone.model.state_dict().items():
        assert torch.equal(tensor, weights_before[name]), name  # the backbone is frozen
    trained = method.trained_tensors(classifier)
    assert set(trained) == set(prompt_before)
    assert any(not torch.equal(trained[k], prompt_before[k]) for k in trained)

    before = classifier.predict(toy.texts[:4])
    loaded, loaded_method = save_and_reload(classifier, method, sharp_dir, tmp_path, CONFIG, result, base_sha)
    assert loaded_method.spec == spec
    for a, b in zip(loaded.predict(toy.texts[:4]), before, strict=True):
        assert a.probabilities == b.probabilities  # exactly: same prompt, store and bias


@pytest.mark.parametrize("labels", ["0=bad,1=good", "0=zebra,1=good"])  # " zebra": 6 tokens here
def test_prefix_from_real_words_equals_writing_them_into_the_template(
    causal_backbone: Backbone, labels: str, toy
) -> None:
    # Li and Liang's init: the prefix is the words' own key/value cache, so before training the model
    # reads exactly "good film" + prompt. The tiny tokenizer adds no specials (see test_soft_prompts).
    # A multi-token label word is scored by extending the prompt's cache, which then holds the prefix.
    verbalizer = Verbalizer.parse(labels)
    ids = causal_backbone.tokenizer("good film", add_special_tokens=False)["input_ids"]
    method = build_method(f"prefix-tuning/init=text/init-text=good film/num-virtual-tokens={len(ids)}")
    classifier = method.prepare(Classifier(causal_backbone, toy.template, verbalizer))
    assert isinstance(classifier.prompt, KeyValuePrefix)
    written = causal_backbone.encoder(Template("good film{text} It was {mask}"), verbalizer)
    assert max(len(w) for w in written.label_token_ids) == (6 if "zebra" in labels else 1)
    texts = ["the movie was great and fun", "bad", "a good film with a great cast , it was"]
    with torch.inference_mode():
        expected = causal_backbone.forward(written.encode(texts), written.label_token_ids)
        got = causal_backbone.forward(
            classifier.encoder.encode(texts), classifier.encoder.label_token_ids, prompt=classifier.prompt
        )
    torch.testing.assert_close(got.hidden, expected.hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.label_log_probs, expected.label_log_probs, atol=1e-5, rtol=1e-4)


def test_prompt_tuning_starts_from_the_label_word_embeddings(any_backbone: Backbone, toy) -> None:
    """As the embedding module returns them: Gemma 3's scales the table by sqrt(hidden size)."""
    backbone = any_backbone
    classifier, _ = fresh_with(backbone, "prompt-tuning/num-virtual-tokens=5", toy)
    assert isinstance(classifier.prompt, VirtualTokens)
    label_ids = [t for word in classifier.encoder.label_token_ids for t in word]
    cycled = torch.tensor((label_ids * 5)[:5], device=backbone.device)  # cycled to fill P
    expected = backbone.input_embeddings(cycled)
    torch.testing.assert_close(classifier.prompt.encoder.embedding.weight, expected)


@pytest.mark.parametrize("spec", ["prompt-tuning", "prefix-tuning", "p-tuning/encoder=lstm"])
def test_a_row_scores_the_same_alone_and_in_a_padded_batch(backbone: Backbone, spec: str, toy) -> None:
    # The prompt's mask must line up with prefix/virtual tokens, padding and text in every row.
    classifier, _ = fresh_with(backbone, spec, toy)
    texts = ["bad", "the movie was great and fun , a good film with a great cast"]
    together = classifier.embed(texts)
    for i, text in enumerate(texts):
        alone = classifier.embed([text])
        np.testing.assert_allclose(alone.lm_log_probs[0], together.lm_log_probs[i], atol=1e-5)
        np.testing.assert_allclose(alone.vectors[0], together.vectors[i], atol=1e-5)
    plain = Classifier(backbone, toy.template, toy.verbalizer).embed(texts)
    assert not np.allclose(plain.lm_log_probs, together.lm_log_probs, atol=1e-6)  # the prompt is read


def test_trainable_parameter_counts(backbone: Backbone, toy) -> None:
    config = backbone.model.config
    width = backbone.input_embeddings.embedding_dim
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    expected = {
        "prompt-tuning": 4 * width,
        "prefix-tuning": 4 * config.num_hidden_layers * 2 * kv_heads * head_dim,
        "p-tuning": 4 * width + 3 * (width * width + width),  # embedding + peft's 3-layer MLP
    }
    for name, count in expected.items():
        classifier, method = fresh_with(backbone, f"{name}/num-virtual-tokens=4", toy)
        assert sum(p.numel() for p in method.trainable_parameters(classifier)) == count, name


def test_prefix_tuning_refuses_a_backbone_that_ignores_past_key_values(
    albert_dir: Path, fresh_classifier
) -> None:
    with pytest.raises(MethodError, match="does not take one: use prompt-tuning or p-tuning"):
        fresh_classifier(albert_dir, "prefix-tuning")
    classifier, _ = fresh_classifier(albert_dir, "prompt-tuning")  # virtual tokens work on any backbone
    assert classifier.embed(["a good film"]).lm_log_probs.shape == (1, 2)


def test_a_saved_prompt_of_another_size_is_refused(causal_backbone: Backbone, toy) -> None:
    classifier, method = fresh_with(causal_backbone, "prompt-tuning/num-virtual-tokens=4", toy)
    other, _ = fresh_with(causal_backbone, "prompt-tuning/num-virtual-tokens=6", toy)
    with pytest.raises(MethodError, match="does not fit"):
        method.load_trained(classifier, dict(other.prompt.state_dict()))


def test_too_many_virtual_tokens_for_the_position_table(masked_backbone: Backbone, toy) -> None:
    limit = masked_backbone.model.config.max_position_embeddings  # 128 for the tiny BERT
    too_many = limit - masked_backbone.config.max_length + 1
    with pytest.raises(MethodError, match="exceeds this backbone's 128 positions"):
        fresh_with(masked_backbone, f"prompt-tuning/num-virtual-tokens={too_many}", toy)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("prompt-tuning/num-virtual-tokens=0", "at least 1"),
        ("prompt-tuning/prompt-lr=0", "prompt_lr must be positive"),
        ("prompt-tuning/init=text", "needs a non-empty init-text"),
        ("prompt-tuning/init-text=hello", "init-text needs init=text"),
        ("prompt-tuning/init=words", "init must be one of labels, text, vocab, random"),
        ("prefix-tuning/init=vocab", "init must be one of labels, text, random"),
        ("prefix-tuning/projection", "add init=random"),
        ("p-tuning/encoder=gru", "encoder must be mlp or lstm"),
        ("p-tuning/init=labels", "no option 'init'"),
    ],
)
def test_bad_options_are_clear_errors(spec: str, match: str) -> None:
    with pytest.raises(MethodError, match=match):
        build_method(spec)


def test_other_inits_and_the_projection_build(backbone: Backbone, toy) -> None:
    for spec in (
        "prompt-tuning/init=vocab",
        "prompt-tuning/init=random",
        "prefix-tuning/projection/init=random",
    ):
        classifier, method = fresh_with(backbone, spec, toy)
        again, _ = fresh_with(backbone, spec, toy)
        first, second = method.trained_tensors(classifier), method.trained_tensors(again)
        assert all(torch.equal(first[k], second[k]) for k in first), spec  # seeded: reproducible
        assert np.isfinite(classifier.embed(toy.texts[:2]).lm_log_probs).all()


def fresh_with(backbone: Backbone, spec: str, toy) -> tuple[Classifier, object]:
    """A prepared classifier on an already loaded backbone (for tests that do not train)."""
    method = build_method(spec)
    return method.prepare(Classifier(backbone, toy.template, toy.verbalizer)), method


@pytest.mark.real_backbone
def test_trainable_parameters_are_under_two_percent_of_smollm2() -> None:
    backbone = load_backbone(BackboneConfig(name="smollm2-135m", max_length=128))  # converted once, cached
    total = sum(p.numel() for p in backbone.model.parameters())
    classifier = Classifier(
        backbone, Template("Review: {text}\nSentiment: {mask}"), Verbalizer.parse("0=negative,1=positive")
    )
    for spec in ("prompt-tuning", "prefix-tuning", "p-tuning"):
        method = build_method(spec)
        prepared = method.prepare(classifier)
        count = sum(p.numel() for p in method.trainable_parameters(prepared))
        assert 0 < count <= 0.02 * total, (spec, count, total)
