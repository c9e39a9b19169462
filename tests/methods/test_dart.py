"""DART on tiny random backbones: trainable template and labels, the fluency objective, checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.methods import MethodError, TrainBatch, build_method, weights_sha256
from openbook.methods import dart as dart_module
from openbook.methods.dart import Dart, DifferentiablePrompt, fluency_loss
from openbook.prompting import EncodedBatch, Template, Verbalizer
from openbook.soft_prompts import text_mask
from openbook.train_config import TrainConfig
from openbook.training import train

from tests.test_checkpoints import HALF_PROBABILITY_ATOL

# The fluency term (predicting text tokens from scratch on a random tiny model) dominates the loss at first,
# so classification needs more steps than prompt-ft's 40.
CONFIG = TrainConfig(steps=60, batch_size=4, lr=3e-3, eval_every=6, patience=20, warmup_ratio=0.0)
TEMPLATE = "Review: {text} It was {mask}"


def fresh(directory: Path, spec: str = "dart", template: str = TEMPLATE) -> tuple[Classifier, Dart]:
    backbone = load_backbone(BackboneConfig(name=str(directory), max_length=48))  # training mutates it
    method = build_method(spec)
    assert isinstance(method, Dart)
    classifier = Classifier(backbone, Template(template), Verbalizer.parse("0=bad,1=good"))
    return method.prepare(classifier), method


def test_dart_trains_everything_and_round_trips(
    model_dir: Path, tmp_path: Path, toy, save_and_reload
) -> None:
    classifier, method = fresh(model_dir, "dart/prompt-lr=0.01")
    prompt = classifier.prompt
    assert isinstance(prompt, DifferentiablePrompt)
    start_template, start_labels = prompt.template.detach().clone(), prompt.labels.detach().clone()
    model = classifier.backbone.model
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trainable = {id(p) for p in method.trainable_parameters(classifier)}
    assert trainable == {id(p) for p in [*model.parameters(), *prompt.parameters()]}
    groups = method.parameter_groups(classifier, 3e-3)
    assert [g["lr"] for g in groups] == [3e-3, 0.01]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in prompt.parameters()}

    base_sha = weights_sha256(model)
    ce_before, fluency_before = objective(classifier, toy)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    ce_after, fluency_after = objective(classifier, toy)
    assert ce_after < 0.5 * ce_before and fluency_after < 0.9 * fluency_before
    assert result.best.accuracy == 1.0
    # Full fine-tuning, as in the paper: the transformer layers move, and so do the prompt's vectors.
    after = model.state_dict()
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert any("layers.1." in name or "layer.1." in name for name in changed)
    assert not torch.allclose(prompt.template, start_template)
    assert not torch.allclose(prompt.labels, start_labels)

    predicted = classifier.predict(toy.texts[:4])
    loaded, loaded_method = save_and_reload(classifier, method, model_dir, tmp_path, CONFIG, result, base_sha)
    assert loaded_method.spec == "dart/prompt-lr=0.01"
    reloaded = loaded.predict(toy.texts[:4])
    for a, b in zip(reloaded, predicted, strict=True):
        # the weights went to disk in float16 (tests/test_checkpoints.py); prompt, store and bias exactly
        assert a.probabilities == pytest.approx(b.probabilities, abs=HALF_PROBABILITY_ATOL)


def objective(classifier: Classifier, toy) -> tuple[float, float]:
    """(L_C, L_F) on the training set without dropout, averaged over fixed draws of the hidden tokens.

    The per-step training losses are too noisy to compare: each step's L_F depends on which text tokens
    were drawn."""
    classifier.backbone.model.eval()
    gold, ce, fluency = torch.tensor(toy.labels), [], []
    with torch.no_grad():
        ce.append(
            float(build_method("dart/no-fluency").loss(classifier, TrainBatch(toy.texts, gold, np.arange(8))))
        )
        for seed in range(5):
            torch.manual_seed(seed)
            fluency.append(float(fluency_loss(classifier, toy.texts, gold)))
    return ce[0], float(np.mean(fluency))


def test_the_fluency_objective_is_what_lowers_the_fluency_loss(model_dir: Path, toy) -> None:
    after = {}
    for spec in ("dart/prompt-lr=0.01", "dart/no-fluency/prompt-lr=0.01"):
        classifier, method = fresh(model_dir, spec)
        train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
        after[spec] = objective(classifier, toy)[1]
    assert after["dart/prompt-lr=0.01"] < 0.8 * after["dart/no-fluency/prompt-lr=0.01"]


def test_untrained_prompt_is_the_hand_written_one(any_backbone: Backbone, toy) -> None:
    """Pseudo-tokens start as the template's words and label vectors as the label words: before training
    DART scores the classes like the plain prompt renormalised over the label words."""
    backbone = any_backbone
    classifier = Classifier(backbone, Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    prepared = build_method("dart").prepare(classifier)
    batch = classifier.encoder.encode([*toy.texts[:3], "bad"])  # rows of different lengths: padding
    with torch.inference_mode():
        plain = backbone.forward(batch, classifier.encoder.label_token_ids)
        ours = backbone.forward(batch, classifier.encoder.label_token_ids, prompt=prepared.prompt)
    torch.testing.assert_close(ours.hidden, plain.hidden)
    torch.testing.assert_close(ours.label_log_probs, plain.label_log_probs.log_softmax(-1))


def test_fluency_matches_a_per_row_reference(
    any_backbone: Backbone, monkeypatch: pytest.MonkeyPatch, toy
) -> None:
    """The batched fluency pass (padding, B*C rows, LM head on the read positions only) against one plain
    forward per row and class, with the hidden token pinned to each row's last text token."""
    backbone = any_backbone
    classifier = build_method("dart").prepare(
        Classifier(backbone, Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    )
    prompt = classifier.prompt
    assert isinstance(prompt, DifferentiablePrompt)
    with torch.no_grad():  # move the vectors off their initial words, so a mix-up would show
        prompt.template.add_(0.3 * torch.randn_like(prompt.template))
        prompt.labels.add_(0.3 * torch.randn_like(prompt.labels))
    special = torch.tensor(backbone.tokenizer.all_special_ids, device=backbone.device)

    def last_text_token(batch: EncodedBatch, _backbone: Backbone) -> tuple[torch.Tensor, torch.Tensor]:
        candidates = text_mask(batch) & ~torch.isin(batch.input_ids, special)
        positions = torch.arange(candidates.shape[1], device=candidates.device).expand_as(candidates)
        return positions.masked_fill(~candidates, -1).argmax(1), candidates.any(1)

    monkeypatch.setattr(dart_module, "choose_text_tokens", last_text_token)
    texts, gold = [*toy.texts[:3], "bad"], torch.tensor([1, 1, 0, 0])
    with torch.no_grad():
        batched = fluency_loss(classifier, texts, gold)
        reference = [
            reference_fluency(classifier, text, label, int(g))
            for text, g in zip(texts, gold, strict=True)
            for label in range(2)
        ]
    torch.testing.assert_close(batched, torch.stack(reference).mean(), atol=1e-5, rtol=1e-4)


def reference_fluency(classifier: Classifier, text: str, label: int, gold: int) -> torch.Tensor:
    backbone, prompt = classifier.backbone, classifier.prompt
    assert isinstance(prompt, DifferentiablePrompt)
    batch = classifier.encoder.encode([text]).to(backbone.device)  # one row: no padding
    assert batch.template_mask is not None
    ids = batch.input_ids[0]
    row = backbone.input_embeddings(ids).clone()  # (T, E)
    row[batch.template_mask[0]] = prompt.template
    special = torch.tensor(backbone.tokenizer.all_special_ids, device=backbone.device)
    chosen = int(torch.nonzero(text_mask(batch)[0] & ~torch.isin(ids, special)).max())
    as_input = prompt.labels[label] * backbone.input_embedding_scale  # as the model reads a tied row
    if backbone.kind == "masked":
        row[int(batch.slot_index[0])] = as_input
        row[chosen] = backbone.input_embeddings.weight[backbone.tokenizer.mask_token_id]
    else:  # class vector first; the position before the chosen token (in the shifted row) predicts it
        row = torch.cat([as_input[None], row])
    p = backbone.model(inputs_embeds=row[None]).logits[0, chosen].softmax(-1)[ids[chosen]]
    return F.binary_cross_entropy(p, torch.tensor(float(label == gold), device=p.device))


def test_untrained_fluency_reads_each_class_vector_as_its_label_word(gemma_backbone: Backbone, toy) -> None:
    """Gemma 3 ties its LM head to the embedding table and scales that table by sqrt(hidden size) on the
    way in: an untrained class vector (its word's head row) enters the fluency pass as its word would."""
    backbone = gemma_backbone
    assert backbone.model.config.tie_word_embeddings and backbone.input_embedding_scale > 1
    classifier = build_method("dart").prepare(
        Classifier(backbone, Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    )
    seen: list[torch.Tensor] = []
    hook = backbone.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            fluency_loss(classifier, toy.texts[:1], torch.tensor([1]))
            words = [
                backbone.input_embeddings(torch.tensor(ids)).mean(0)
                for ids in classifier.encoder.label_token_ids
            ]
    finally:
        hook.remove()
    torch.testing.assert_close(seen[0][:, 0], torch.stack(words))  # row c: class c's vector, then the text


def test_fluency_term_is_finite_and_changes_the_loss(backbone: Backbone, toy) -> None:
    classifier = Classifier(backbone, Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    with_fluency, without = build_method("dart"), build_method("dart/no-fluency")
    prepared = with_fluency.prepare(classifier)
    batch = TrainBatch(toy.texts[:4], torch.tensor(toy.labels[:4]), np.arange(4))
    torch.manual_seed(0)
    term = fluency_loss(prepared, batch.texts, batch.gold)
    assert torch.isfinite(term) and term > 0
    on, off = with_fluency.loss(prepared, batch), without.loss(prepared, batch)
    assert torch.isfinite(on) and not torch.isclose(on, off)
    # The fluency pass reads the class vectors as inputs: they get gradients from it alone.
    term.backward()
    assert prepared.prompt is not None
    for parameter in prepared.prompt.parameters():
        if parameter is not getattr(prepared.prompt, "label_bias", None):
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    backbone.model.zero_grad(set_to_none=True)  # the backbone is shared with other tests


def test_random_choice_picks_only_input_text(masked_backbone: Backbone, toy) -> None:
    encoder = masked_backbone.encoder(Template(TEMPLATE), Verbalizer.parse("0=bad,1=good"))
    batch = encoder.encode(toy.texts[:3])
    special = torch.tensor(masked_backbone.tokenizer.all_special_ids)
    allowed = text_mask(batch) & ~torch.isin(batch.input_ids, special)
    seen = torch.zeros_like(allowed)
    rows = torch.arange(3)
    for _ in range(200):
        chosen, counted = dart_module.choose_text_tokens(batch, masked_backbone)
        assert counted.all() and allowed[rows, chosen].all()
        seen[rows, chosen] = True
    assert torch.equal(seen, allowed)  # every text token, and nothing else ([CLS], [SEP], template)


def test_a_template_without_its_own_tokens_is_refused(model_dir: Path) -> None:
    with pytest.raises(MethodError, match="has none"):
        fresh(model_dir, template="{text}{mask}")


def test_bad_options_and_mismatched_checkpoints(causal_dir: Path) -> None:
    for bad, match in [
        ("dart/prompt-lr=0", "prompt_lr must be positive"),
        ("dart/fluency-weight=-1", "non-neg"),
    ]:
        with pytest.raises(ValueError, match=match):
            build_method(bad)
    assert build_method("dart/no-fluency/fluency-weight=0.5").spec == "dart/no-fluency/fluency-weight=0.5"
    classifier, method = fresh(causal_dir)
    other, _ = fresh(causal_dir, template="Text: {text} Overall it was {mask}")  # more template tokens
    with pytest.raises(MethodError, match="does not fit"):
        method.load_trained(other, method.trained_tensors(classifier))
