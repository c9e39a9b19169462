"""IPT: prompts generated per input, the backbone frozen, a pretrained token table in the model cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.classifier import Classifier
from openbook.methods import Method, MethodError, build_method, weights_sha256
from openbook.methods.ipt import (
    InstancePrompt,
    IPTConfig,
    LabelledCorpus,
    build_prompt,
    neutral_token,
    pretrain_prompt_table,
    pretrained_table_path,
)
from openbook.prompting import Template, Verbalizer
from openbook.train_config import TrainConfig
from openbook.training import train

CONFIG = TrainConfig(steps=100, batch_size=4, lr=1e-5, eval_every=10, patience=10, warmup_ratio=0.0)
GENERATORS = ["ipt/strategy=random", "ipt/encoder=lstm", "ipt/encoder=cnn", "ipt/encoder=mlp"]
SPECS = [*GENERATORS, "ipt/strategy=pretrained"]
SMOLLM2_PARAMETERS = 134_515_008  # SmolLM2-135M: vocabulary 49152, embeddings 576


@pytest.fixture(autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.getbasetemp() / "ipt-model-cache"  # one per session: tables are built once
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(cache))
    return cache


def tiny_corpora(toy) -> list[LabelledCorpus]:
    """Two generated categories, each with its own prompt, as the real corpus has one per task."""
    good, bad = ["great", "good", "fun"], ["terrible", "bad", "awful", "boring"]
    reviews = [f"the film was {w}" for w in good + bad] + [f"a {w} cast" for w in good + bad]
    labels = [1] * 3 + [0] * 4 + [1] * 3 + [0] * 4
    questions = ["who wrote the book", "where is the city", "what is the answer", "who is the river"] * 2
    return [
        LabelledCorpus("reviews", toy.template, toy.verbalizer, reviews, np.array(labels)),
        LabelledCorpus(
            "questions",
            Template("{text} ? {mask}"),
            Verbalizer.parse("0=no,1=yes"),
            questions,
            np.array([1, 0, 1, 0] * 2),
        ),
    ]


def ensure_tiny_table(backbone: Backbone, toy, spec: str = "ipt/strategy=pretrained") -> Path:
    config = build_method(spec).config
    assert isinstance(config, IPTConfig)
    path = pretrained_table_path(backbone, config)
    if not path.exists():
        path = pretrain_prompt_table(backbone, tiny_corpora(toy), config, steps=6, batch_size=4)
    return path


def fresh(directory: Path, spec: str, toy) -> tuple[Classifier, Method]:
    backbone = load_backbone(BackboneConfig(name=str(directory), max_length=48))  # training mutates
    method = build_method(spec)
    assert isinstance(method.config, IPTConfig)
    if method.config.strategy == "pretrained":
        ensure_tiny_table(backbone, toy, spec)
    return method.prepare(Classifier(backbone, toy.template, toy.verbalizer)), method


def instance_part(classifier: Classifier, texts: list[str]) -> torch.Tensor:
    """(B, k, E) the generated prompts minus the shared base vectors: what depends on the input."""
    assert isinstance(classifier.prompt, InstancePrompt)
    batch = classifier.encoder.encode(texts).to(classifier.backbone.device)
    embeds = classifier.backbone.input_embeddings(batch.input_ids)
    with torch.no_grad():
        return classifier.prompt.generate(embeds, batch) - classifier.prompt.base


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("spec", SPECS)
def test_trains_only_the_generator_and_round_trips(
    sharp_dir: Path, spec: str, tmp_path: Path, toy, save_and_reload
) -> None:
    classifier, method = fresh(sharp_dir, f"{spec}/prompt-lr=0.003", toy)  # tiny models: 3x the default
    backbone_before = {k: v.clone() for k, v in classifier.backbone.model.state_dict().items()}
    assert classifier.prompt is not None
    prompt_before = {k: v.clone() for k, v in classifier.prompt.state_dict().items()}
    trainable = method.trainable_parameters(classifier)
    assert {id(p) for p in trainable} == {id(p) for p in classifier.prompt.parameters()}
    assert [g["lr"] for g in method.parameter_groups(classifier, 1e-5)] == [method.config.prompt_lr]

    base_sha = weights_sha256(classifier.backbone.model)
    result = train(classifier, method, toy.texts, toy.labels, toy.texts, toy.labels, CONFIG, progress=False)
    # The loss over all training texts (dev = train here) at each dev check: unlike the per-batch losses
    # it has no sampling noise, and unlike the kept weights (chosen on accuracy first) it is the loss.
    losses = [-h["log_likelihood"] for h in result.history]
    assert min(losses[1:]) < 0.7 * losses[0], losses
    for name, tensor in classifier.backbone.model.state_dict().items():
        assert torch.equal(tensor, backbone_before[name]), f"frozen backbone weight {name} changed"
    changed = [k for k, v in classifier.prompt.state_dict().items() if not torch.equal(v, prompt_before[k])]
    assert "project.weight" in changed and "base" in changed

    before = classifier.predict(toy.texts[:4])
    loaded, loaded_method = save_and_reload(classifier, method, sharp_dir, tmp_path, CONFIG, result, base_sha)
    assert loaded_method.spec == method.spec
    after = loaded.predict(toy.texts[:4])
    for a, b in zip(after, before, strict=True):
        assert a.probabilities == b.probabilities  # exactly: same generator, same frozen backbone


@pytest.mark.parametrize("spec", SPECS)
def test_different_inputs_get_different_prompts(backbone: Backbone, spec: str, toy) -> None:
    if spec.endswith("pretrained"):
        ensure_tiny_table(backbone, toy)
    classifier = build_method(spec).prepare(Classifier(backbone, toy.template, toy.verbalizer))
    prompts = instance_part(classifier, ["the movie was great and fun", "who wrote the book"])
    assert prompts.shape == (2, 4, backbone.input_embeddings.embedding_dim)
    # Untrained encoders mean-pool random features, so inputs differ by a few percent (the MLP least).
    assert relative_difference(prompts[0], prompts[1]) > 0.01


def test_prompts_start_at_a_line_break_as_the_model_reads_it(any_backbone: Backbone, toy) -> None:
    """The base vectors are the neutral token's embedding as the embedding module returns it (Gemma 3
    scales the table by sqrt(hidden size)), and the input-dependent part is small beside it."""
    backbone = any_backbone
    prompt = build_prompt(IPTConfig(), backbone)
    line_break = torch.tensor(neutral_token(backbone.tokenizer), device=backbone.device)
    with torch.no_grad():
        expected = backbone.input_embeddings(line_break).float()
    torch.testing.assert_close(prompt.base, expected.expand_as(prompt.base))
    classifier = dataclasses.replace(Classifier(backbone, toy.template, toy.verbalizer), prompt=prompt)
    instance = instance_part(classifier, toy.texts[:2])  # (2, k, E)
    assert 0 < float(instance.norm(dim=-1).mean()) < float(expected.norm())


@pytest.mark.parametrize("spec", GENERATORS)
def test_padding_does_not_change_the_prompts(backbone: Backbone, spec: str, toy) -> None:
    classifier = build_method(spec).prepare(Classifier(backbone, toy.template, toy.verbalizer))
    alone = instance_part(classifier, ["a bad film"])
    longer = "the movie was great and fun , a good film with a great cast , it was"
    padded = instance_part(classifier, [longer, "a bad film"])
    batch = classifier.encoder.encode([longer, "a bad film"])
    assert batch.attention_mask[1].sum() < batch.attention_mask.shape[1]  # the short row really is padded
    # Float noise only. On a GPU, cuDNN picks LSTM and convolution kernels by batch shape, and may
    # run them in TF32 (measured there: 3.4e-5), so the bound is looser than on a CPU.
    noise = 1e-5 if backbone.device.type == "cpu" else 1e-3
    assert relative_difference(padded[1], alone[0]) < noise
    assert relative_difference(padded[0], padded[1]) > 0.01


def test_bad_options_are_refused() -> None:
    for spec, match in [
        ("ipt/encoder=gru", "unknown encoder 'gru'; valid: lstm, cnn, mlp"),
        ("ipt/strategy=magic", "valid: random, encoder, pretrained"),
        ("ipt/num-prompts=0", "at least 1"),
        ("ipt/prompt-lr=0", "positive"),
        ("ipt/corpus=a b", "corpus must be a name"),
    ]:
        with pytest.raises(MethodError, match=match):
            build_method(spec)


def test_tensors_of_another_generator_are_refused(masked_backbone: Backbone, toy) -> None:
    table = build_method("ipt/strategy=random")
    tensors = table.trained_tensors(table.prepare(Classifier(masked_backbone, toy.template, toy.verbalizer)))
    lstm = build_method("ipt/encoder=lstm")
    with pytest.raises(MethodError, match="does not fit"):
        lstm.load_trained(lstm.prepare(Classifier(masked_backbone, toy.template, toy.verbalizer)), tensors)


def test_pretrained_needs_its_table_and_loads_it(causal_backbone: Backbone, toy) -> None:
    from safetensors.torch import load_file

    missing = build_method("ipt/strategy=pretrained/corpus=nowhere")
    with pytest.raises(MethodError, match=r"python -m research ipt-table .*corpus=nowhere"):
        missing.prepare(Classifier(causal_backbone, toy.template, toy.verbalizer))
    path = ensure_tiny_table(causal_backbone, toy)
    with pytest.raises(MethodError, match="rank 8"):  # another size is another table
        build_method("ipt/strategy=pretrained/rank=8").prepare(
            Classifier(causal_backbone, toy.template, toy.verbalizer)
        )
    classifier = build_method("ipt/strategy=pretrained").prepare(
        Classifier(causal_backbone, toy.template, toy.verbalizer)
    )
    assert classifier.prompt is not None
    saved = load_file(path, device=str(causal_backbone.device))
    for name, tensor in classifier.prompt.state_dict().items():
        assert torch.equal(tensor, saved[name])
    untrained = build_method("ipt/strategy=random").prepare(
        Classifier(causal_backbone, toy.template, toy.verbalizer)
    )
    assert untrained.prompt is not None
    assert not torch.equal(untrained.prompt.state_dict()["project.weight"], saved["project.weight"])


def test_pretraining_lowers_the_loss_on_its_corpus(sharp_dir: Path, toy) -> None:
    backbone = load_backbone(BackboneConfig(str(sharp_dir), max_length=48))
    config = IPTConfig(strategy="pretrained", corpus="tiny-longer", prompt_lr=0.01)

    def corpus_loss(prompt: InstancePrompt) -> float:
        losses = []
        for corpus in tiny_corpora(toy):
            classifier = Classifier(backbone, corpus.template, corpus.verbalizer, prompt=prompt)
            with torch.no_grad():
                log_probs, _ = classifier.label_scores(list(corpus.texts))
            gold = torch.as_tensor(corpus.labels, device=log_probs.device)
            losses.append(float(torch.nn.functional.cross_entropy(log_probs, gold)))
        return float(np.mean(losses))

    before = corpus_loss(build_prompt(config, backbone))  # what training starts from
    pretrain_prompt_table(backbone, tiny_corpora(toy), config, steps=30, batch_size=4, lr=0.01)
    pretrained = build_method("ipt/strategy=pretrained/corpus=tiny-longer").prepare(
        Classifier(backbone, toy.template, toy.verbalizer)
    )
    assert isinstance(pretrained.prompt, InstancePrompt)
    assert corpus_loss(pretrained.prompt) < 0.7 * before


@pytest.mark.parametrize("spec", SPECS)
def test_trainable_parameters_stay_under_two_percent_of_smollm2(spec: str) -> None:
    config = build_method(spec).config
    assert isinstance(config, IPTConfig)
    prompt = InstancePrompt(config, vocab_size=49152, embed_dim=576)
    count = sum(p.numel() for p in prompt.parameters())
    assert 0 < count <= 0.02 * SMOLLM2_PARAMETERS, f"{spec}: {count} parameters"
